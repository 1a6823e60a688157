"""Bookings and revenue per hour from run events: an outside consumer of the public contracts."""

"""The domain floor: what a run is and every pure decision over it. Imports only contracts and itself."""

"""The fake outside world (hotels, payments, email, CRM and a scripted model) that demos and tests run against."""

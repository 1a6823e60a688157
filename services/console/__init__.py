"""The evidence console: server-rendered pages for operators, at /console in the gateway's process (mounted there by
`crashsafe serve gateway`, never imported by the gateway)."""

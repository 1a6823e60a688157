"""Records several services share, each in its JetStream bucket or stream (the run journal, session lanes,
approvals, client keys, guest profiles, active runs, tickets, asks), and the capability keys on disk."""

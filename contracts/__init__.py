"""The public contract of crashsafe: subjects, streams, messages and errors that every service and outside consumer shares."""

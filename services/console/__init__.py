"""The evidence console: server-rendered pages for operators, mounted by the gateway at /console."""

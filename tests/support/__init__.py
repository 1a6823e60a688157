"""What the tests share, one copy each. Import from the module that owns a thing:

* `waiting`: `eventually` (poll until true, never a bare sleep) and `unique` names.
* `world`: the outside world as a test sees it: the booking sentence, the sandbox's ledger and faults over HTTP,
  the effect counts a booking makes.
* `stack`: a whole stack of real processes and the client that drives it like a guest and an operator
  (`open_stack`, `StackClient`, `supervised`, the `crashsafe` CLI).
* `journals`: reading journals (events as the gateway serves them, or typed) and rebuilding wire messages.
* `broker`: reading JetStream from a test: dead letters, settled consumers, action subjects.
* `runs`: pure builders for the runtime core: hand-made journals, a driven run, the replay check.
* `paths`: the repository root and the golden files.
* `inprocess`: the ONE place that constructs services inside the test process (Runtime, Executor, Reconciler,
  Settings, the sandbox server); when a constructor changes, only that file changes.
"""

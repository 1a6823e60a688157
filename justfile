# crashsafe: `just` lists the recipes.

venv := ".venv"
bin := venv + "/bin"

default:
    @just --list

# --- setup ---

# create the virtualenv and install the project with its dev tools
install:
    python3 -m venv {{venv}}
    {{bin}}/pip install -e '.[dev]'

# --- run ---

# the booking with a worker killed at the worst moment (SEAM: see docs/failure-modes.md)
demo seam="executor.after_provider_ack":
    {{bin}}/crashsafe demo --crash {{seam}}

# start the whole stack and supervise it (state in .crashsafe/)
up:
    {{bin}}/crashsafe up

# stop the stack started by `just up`
down:
    {{bin}}/crashsafe down

# --- check ---

# the test suite (real nats-server, real processes) in 4 parallel workers; `just test -n 0` runs it serially
test *args:
    {{bin}}/pytest {{args}}

# the pure tests only (no nats-server, no processes, no network): seconds, for every edit; serially, since four
# workers each collecting and importing everything cost more than these tests take
test-unit *args:
    {{bin}}/pytest -n 0 -m unit tests/unit {{args}}

# mutation testing of contracts and the pure cores on tests/unit (mutmut, 2 workers); ARGS: mutant names or globs
mutate *args:
    {{bin}}/python -c 'import mutmut' 2>/dev/null || {{bin}}/pip install -q -e '.[dev,mutation]'
    PATH="$PWD/{{bin}}:$PATH" {{bin}}/mutmut run --max-children 2 {{args}}  # mypy, for type_check_command
    @echo "mutants by status:" && {{bin}}/mutmut results --all true | sed 's/.*: //' | sort | uniq -c
    @echo "not killed (mutmut show NAME for the diff; docs/testing.md says why each is harmless):"
    @{{bin}}/mutmut results | grep -v ': caught by type check$' || true

# ruff (lint and format) and mypy (strict on contracts and the pure cores), as CI runs them
lint:
    {{bin}}/ruff check .
    {{bin}}/ruff format --check .
    {{bin}}/mypy

# format the code
fmt:
    {{bin}}/ruff format .

# the eval suite: StayHub conversations with expected outcomes, pass rate per class (ARGS: --class C, --model openai)
eval *args:
    {{bin}}/python -m evals {{args}}

# re-record the replay corpus (tests/corpus/*.jsonl) from real runs of the whole stack; ARGS: --only NAME
record-corpus *args:
    {{bin}}/python -m tests.corpus.record {{args}}

# --- measure ---

# throughput and latency benchmarks (booking, steps5); figures go to docs/benchmarks.md
bench *args:
    {{bin}}/python bench/run.py {{args}}

# the properties that hold in every shape, across the whole matrix: partitions 4/16/64, 1 or 3 replicas, agents
# well behaved, raising, answering nonsense, blocking and looping (CI runs two shapes of it)
shapes *args:
    CRASHSAFE_SHAPES=full {{bin}}/pytest -n 0 tests/e2e/test_shapes.py {{args}}

# chaos soak: random SIGKILLs of every service and nats-server under load
chaos *args:
    {{bin}}/python bench/chaos.py {{args}}

# retention soak: runs through many retention periods (seconds), kept lanes, active records and executor rows must
# stay flat (CI runs 3 rounds of 8 runs); ROUNDS and RUNS: a longer one
soak-retention rounds="30" runs="20":
    SOAK_ROUNDS={{rounds}} SOAK_RUNS_A_ROUND={{runs}} {{bin}}/pytest -n 0 -s tests/integration/test_retention_soak.py

# --- docs ---

# regenerate every generated document (docs/events.md, docs/schemas/, docs/asyncapi.json, docs/openapi.json,
# contracts/lock.json, contracts/wire.json); refuses a breaking change to the contracts, against the locks and the
# previous release's snapshot (a breaking change is a new event type; on the broker, a new name beside the old)
docs:
    {{bin}}/python -m crashsafe.contract_docs

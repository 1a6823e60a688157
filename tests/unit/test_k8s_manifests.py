"""The Kubernetes base in infra/k8s, rendered as kustomize would and checked without a cluster: every object
against the Kubernetes schemas (strict), and the rules the product depends on: probes on declared ports, each
role's pod holding only its own NATS credential and keys, non-root everywhere, one executor per tool family of
the registry, the nats chart's values including the generated users from where they are mounted, and the rolling
upgrade's (docs/upgrading.md): no old pod stopped before a new one is ready, a disruption budget over every
workload that a drain can meet, the release's version on every workload and image, provisioning that only adds.

Each rule is a function returning what breaks it; the rules are also run on broken copies of the base, so a
rule that can no longer fail is caught too.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from crashsafe.contracts.nats_permissions import users
from crashsafe.contracts.release import VERSION
from crashsafe.contracts.subjects import Namespace
from crashsafe.domain import registry as registries
from crashsafe.infra import infra_nats_auth
from crashsafe.services.platform.environment_variables import VARIABLES
from crashsafe.services.platform.settings import Settings
from crashsafe.services.records.capability_keys import write_key_pair
from tests.support.kustomize import Rendered, render
from tests.support.paths import ROOT

BASE = ROOT / "infra" / "k8s"
# The oldest Kubernetes minor still supported upstream and the newest the schemas know.
K8S_VERSIONS = ("1.33.0", "1.37.0")
OPS_PORT = 9464
GATEWAY_PORT = 8080
NATS_CREDS = "nats-creds-"
# Secrets that belong to one role each: only pods of that component may mount or read them.
ROLE_SECRETS = {
    "crashsafe-capability-signing-key": {"runtime"},
    # Public keys: the executors check capabilities with them, the gateway names them in evidence bundles.
    "crashsafe-capability-verify-keys": {
        "gateway",
        *(f"executor-{f}" for f in ("booking", "memory", "notify", "payment")),
    },
    "crashsafe-synthetic-api-key": {"reconciler"},
    "crashsafe-model": {"runtime"},
}
# NATS users that are no pod of this base: `analytics` is the example consumer's (examples/analytics).
NOT_PODS = {"analytics"}
VERSION_LABEL = "app.kubernetes.io/version"
# The least terminationGracePeriodSeconds for a service's drain on SIGTERM: a runtime step may be a model call (30 s
# on the default route) and its append; an executor's keyed write a call, a lookup and a call again.
DRAIN_S = {"runtime": 60, "executor": 60}
DEFAULT_DRAIN_S = 30
# A Deployment's rolling update: one new pod beside the old ones, none stopped before a new one is ready.
SURGE_ONE = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}

Rule = Callable[[Rendered], list[str]]


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render(BASE)


def _component(obj: dict[str, Any]) -> str:
    return str(obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["template"]["spec"])


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _ports(container: dict[str, Any]) -> dict[str | int, int]:
    ports: dict[str | int, int] = {}
    for port in container.get("ports", []):
        ports[port["containerPort"]] = port["containerPort"]
        if "name" in port:
            ports[port["name"]] = port["containerPort"]
    return ports


def _services(base: Rendered) -> list[dict[str, Any]]:
    """The long-running workloads (not the provisioning Job)."""
    return [o for o in base.workloads() if o["kind"] != "Job"]


def _selector(obj: dict[str, Any]) -> dict[str, str]:
    selector = obj["spec"]["selector"]
    return dict(selector.get("matchLabels", selector))


def _secrets_of(pod: dict[str, Any]) -> set[str]:
    """Every Secret a pod can read: its secret volumes and the env and envFrom references of its containers."""
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    for container in pod["containers"]:
        names |= {
            e["valueFrom"]["secretKeyRef"]["name"]
            for e in container.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        names |= {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
    return names


# The rules ----------------------------------------------------------------------------------------------------


def schema_problems(base: Rendered) -> list[str]:
    problems = []
    for obj in base.objects:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                problems.append(f"{obj['kind']}/{obj['metadata']['name']} (k8s {version}): {exc.message}")
    return problems


def probe_problems(base: Rendered) -> list[str]:
    """Every long-running container: liveness on /healthz and readiness on /readyz, on a port it declares, which
    is the ops port (the gateway: its own HTTP port); its scrape annotation names the same port."""
    problems = []
    for obj in base.workloads():
        if obj["kind"] == "Job":
            continue
        name = obj["metadata"]["name"]
        expected = GATEWAY_PORT if _component(obj) == "gateway" else OPS_PORT
        for container in _pod(obj)["containers"]:
            ports = _ports(container)
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                get = container.get(probe, {}).get("httpGet")
                if get is None:
                    problems.append(f"{name}: no {probe} httpGet")
                    continue
                if get["path"] != path:
                    problems.append(f"{name}: {probe} asks {get['path']}, not {path}")
                if ports.get(get["port"]) != expected:
                    problems.append(f"{name}: {probe} port {get['port']!r} is not a declared port {expected}")
        annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/port") != str(
            expected
        ):
            problems.append(f"{name}: prometheus annotations do not name port {expected}")
    return problems


def credential_problems(base: Rendered) -> list[str]:
    """Each pod mounts exactly its own role's NATS credential (the Job: the operator's) and points
    CRASHSAFE_NATS_CREDS at it; the role-only secrets reach only their role; every secret a pod needs exists."""
    problems = []
    existing = {s["metadata"]["name"] for s in base.of_kind("Secret")}
    for obj in base.workloads():
        name = obj["metadata"]["name"]
        component = _component(obj)
        role = "operator" if component == "infra-apply" else component
        pod = _pod(obj)
        secrets = _secrets_of(pod)
        creds = {s for s in secrets if s.startswith(NATS_CREDS)}
        if creds != {NATS_CREDS + role}:
            problems.append(f"{name}: mounts NATS credentials {sorted(creds)}, not only {NATS_CREDS + role}")
        for secret in secrets - creds:
            allowed = ROLE_SECRETS.get(secret)
            if allowed is None or component not in allowed:
                problems.append(f"{name}: reads secret {secret}, which is not for {component}")
        for container in pod["containers"]:
            mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
            volume = next(
                (
                    v["name"]
                    for v in pod["volumes"]
                    if v.get("secret", {}).get("secretName") == NATS_CREDS + role
                ),
                None,
            )
            wanted = posixpath.join(mounts.get(volume or "", "?"), "nats.creds")
            got = _env(container).get("CRASHSAFE_NATS_CREDS", {}).get("value")
            if got != wanted:
                problems.append(
                    f"{name}: CRASHSAFE_NATS_CREDS={got!r}, its credential is mounted at {wanted}"
                )
            for variable, ref in _env(container).items():
                path = ref.get("value", "")
                if path.startswith("/var/run/") and not any(
                    posixpath.dirname(p) == mount for p in path.split(",") for mount in mounts.values()
                ):
                    problems.append(f"{name}: {variable}={path} is in no volume it mounts")
                key_ref = ref.get("valueFrom", {}).get("secretKeyRef")
                if key_ref and not key_ref.get("optional") and key_ref["name"] not in existing:
                    problems.append(f"{name}: needs secret {key_ref['name']}, which the base does not make")
        for volume in pod.get("volumes", []):
            if "secret" in volume and volume["secret"]["secretName"] not in existing:
                problems.append(f"{name}: mounts secret {volume['secret']['secretName']}, which is not made")
    return problems


def security_problems(base: Rendered) -> list[str]:
    """Non-root, no privilege escalation, no capabilities, a read-only root, requests and limits: every pod."""
    problems = []
    for obj in base.workloads():
        name = obj["metadata"]["name"]
        pod = _pod(obj)
        context = pod.get("securityContext", {})
        if context.get("runAsNonRoot") is not True or not context.get("runAsUser"):
            problems.append(f"{name}: the pod may run as root")
        if pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{name}: mounts a service account token it never uses")
        for container in pod["containers"] + pod.get("initContainers", []):
            sc = container.get("securityContext", {})
            if sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False:
                problems.append(f"{name}/{container['name']}: runs as root")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{name}/{container['name']}: writable root filesystem")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name}/{container['name']}: may escalate privileges")
            if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
                problems.append(f"{name}/{container['name']}: keeps capabilities")
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                if not {"cpu", "memory"} <= set(resources.get(kind, {})):
                    problems.append(f"{name}/{container['name']}: no cpu and memory {kind}")
    return problems


def executor_problems(base: Rendered) -> list[str]:
    """One StatefulSet per tool family of the registry the ConfigMap names, each serving its own family, with a
    volume claim for its data dir; and one NATS credential secret per NATS user that is a pod."""
    config = base.get("ConfigMap", "crashsafe-config")["data"]
    registry = registries.load(config["CRASHSAFE_REGISTRY"])
    families = set(registry.families)
    problems = []
    executors = {
        o["metadata"]["name"]: o
        for o in base.workloads()
        if _component(o).startswith("executor-") or o["metadata"]["name"].startswith("executor-")
    }
    if set(executors) != {f"executor-{f}" for f in families}:
        problems.append(f"executors {sorted(executors)} but the registry's families are {sorted(families)}")
    for name, obj in executors.items():
        family = name.removeprefix("executor-")
        if obj["kind"] != "StatefulSet":
            problems.append(f"{name}: a {obj['kind']}; its stores need a volume per replica")
            continue
        container = _pod(obj)["containers"][0]
        if container["args"] != ["serve", "executor", "--tool", family]:
            problems.append(f"{name}: serves {container['args']}, not the {family} family")
        claims = {c["metadata"]["name"] for c in obj["spec"].get("volumeClaimTemplates", [])}
        data_dir = config["CRASHSAFE_DATA_DIR"]
        mounted = {m["name"] for m in container["volumeMounts"] if m["mountPath"] == data_dir}
        if not mounted or not mounted <= claims:
            problems.append(f"{name}: {data_dir} is not on a volume claim of its own")
    partitions = int(config["CRASHSAFE_ACTION_PARTITIONS"])
    pods = {u.name for u in users(Namespace(config["CRASHSAFE_NAMESPACE"]), families, partitions)} - NOT_PODS
    secrets = {s["metadata"]["name"] for s in base.of_kind("Secret")}
    missing = sorted(p for p in pods if NATS_CREDS + p not in secrets)
    if missing:
        problems.append(f"no credential secret for NATS users {missing}")
    return problems


def selector_problems(base: Rendered) -> list[str]:
    """Every Service, PodDisruptionBudget and HPA points at pods (or a Deployment) the base makes."""
    pods = [o["spec"]["template"]["metadata"]["labels"] for o in base.workloads()]
    problems = []
    for kind in ("Service", "PodDisruptionBudget"):
        for obj in base.of_kind(kind):
            selector = obj["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            if not any(selector.items() <= labels.items() for labels in pods):
                problems.append(f"{kind}/{obj['metadata']['name']} selects no pod")
    deployments = {o["metadata"]["name"] for o in base.of_kind("Deployment")}
    for hpa in base.of_kind("HorizontalPodAutoscaler"):
        if hpa["spec"]["scaleTargetRef"]["name"] not in deployments:
            problems.append(f"HPA/{hpa['metadata']['name']} scales nothing")
    for service in base.of_kind("Service"):
        workload = (
            next(
                o
                for o in base.workloads()
                if service["spec"]["selector"].items() <= o["spec"]["template"]["metadata"]["labels"].items()
            )
            if service["spec"].get("selector")
            else None
        )
        for port in service["spec"]["ports"]:
            if workload and port["targetPort"] not in _ports(_pod(workload)["containers"][0]):
                problems.append(
                    f"Service/{service['metadata']['name']}: targetPort {port['targetPort']} undeclared"
                )
    return problems


def variable_problems(base: Rendered) -> list[str]:
    """Every CRASHSAFE_ variable the base sets is one the product reads (or another slice announced)."""
    known = {v.name for v in VARIABLES}
    names = set(base.get("ConfigMap", "crashsafe-config")["data"])
    for obj in base.workloads():
        for container in _pod(obj)["containers"]:
            names |= set(_env(container))
    return [
        f"{n} is set but not a setting"
        for n in sorted(names)
        if n.startswith("CRASHSAFE_") and n not in known
    ]


def _admits(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """The `from` peers of every ingress rule of `policy` that opens `port` ([{}] for "from anywhere")."""
    peers: list[dict[str, Any]] = []
    for rule in policy["spec"].get("ingress", []):
        if any(p.get("port") == port for p in rule.get("ports", [])) or "ports" not in rule:
            peers += rule.get("from", [{}])
    return peers


def network_problems(base: Rendered) -> list[str]:
    """Ingress refused unless admitted: a default deny over every pod; the ops port only from the scraper's
    namespace; NATS's client port only from crashsafe's pods; nothing but the gateway's port from anywhere."""
    policies = [o for o in base.objects if o["kind"] == "NetworkPolicy"]
    problems = []
    if not any(p["spec"]["podSelector"] == {} and "ingress" not in p["spec"] for p in policies):
        problems.append("no default-deny ingress policy over every pod")
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ours = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "crashsafe"}}}
    for policy in policies:
        name = policy["metadata"]["name"]
        selected = policy["spec"]["podSelector"].get("matchLabels", {})
        for peer in _admits(policy, OPS_PORT):
            if peer != scraper:
                problems.append(f"{name}: the ops port {OPS_PORT} is open to {peer or 'anyone'}")
        for peer in _admits(policy, 4222):
            if peer != ours:
                problems.append(f"{name}: NATS's client port is open to {peer or 'anyone'}")
        for rule in policy["spec"].get("ingress", []):
            if "from" not in rule and selected.get("app.kubernetes.io/component") != "gateway":
                problems.append(f"{name}: a port open to anyone on pods other than the gateway's")
    return problems


def rollout_problems(base: Rendered) -> list[str]:
    """No rolling update stops an old pod before a new one is ready: a Deployment surges one pod with none
    unavailable, a StatefulSet (its pods keep their names and volumes) replaces one at a time with no canary
    partition left in the base; a new pod counts only after minReadySeconds; the grace period covers the drain."""
    problems = []
    for obj in _services(base):
        name, spec = obj["metadata"]["name"], obj["spec"]
        if obj["kind"] == "Deployment":
            if spec.get("strategy") != SURGE_ONE:
                problems.append(f"{name}: strategy {spec.get('strategy')}, not {SURGE_ONE}")
        else:
            strategy = spec.get("updateStrategy", {})
            rolling = strategy.get("rollingUpdate", {})
            if strategy.get("type") != "RollingUpdate" or rolling.get("maxUnavailable", 1) != 1:
                problems.append(f"{name}: {strategy}, not a RollingUpdate of one pod at a time")
            if rolling.get("partition", 0) != 0:
                problems.append(
                    f"{name}: partition {rolling['partition']} would hold every rollout at a canary"
                )
        if spec.get("minReadySeconds", 0) < 5:
            problems.append(f"{name}: minReadySeconds {spec.get('minReadySeconds', 0)}, under 5")
        grace = _pod(obj).get("terminationGracePeriodSeconds", 30)
        needed = DRAIN_S.get(_component(obj).split("-")[0], DEFAULT_DRAIN_S)
        if grace < needed:
            problems.append(f"{name}: terminationGracePeriodSeconds {grace}, under its drain's {needed}")
    return problems


def disruption_problems(base: Rendered) -> list[str]:
    """Every Deployment and StatefulSet has one PodDisruptionBudget over its pods, which a drain can always meet
    one pod at a time (a singleton's too: a budget of one available would block every drain of its node) and which
    lets a pod that is not ready be evicted (a rollout stuck on it must not hold up a drain)."""
    problems = []
    budgets = base.of_kind("PodDisruptionBudget")
    for obj in _services(base):
        name = obj["metadata"]["name"]
        labels = obj["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if _selector(b).items() <= labels.items()]
        if len(covering) != 1:
            problems.append(f"{name}: {len(covering)} PodDisruptionBudgets select its pods, not 1")
        for budget in covering:
            spec = budget["spec"]
            replicas = obj["spec"].get("replicas", 1)
            allowed = (
                spec["maxUnavailable"] if "maxUnavailable" in spec else replicas - spec.get("minAvailable", 0)
            )
            if not isinstance(allowed, int) or allowed < 1:
                problems.append(
                    f"PodDisruptionBudget/{budget['metadata']['name']}: no drain can evict {name}"
                )
            if spec.get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
                problems.append(
                    f"PodDisruptionBudget/{budget['metadata']['name']}: keeps pods that are not ready"
                )
    return problems


def version_problems(base: Rendered) -> list[str]:
    """Every workload and its pods carry the release (contracts/release.py VERSION) as `app.kubernetes.io/version`
    and run the image tagged with it; no selector and no volume claim template names the version (a Deployment's or
    StatefulSet's cannot change, and a Service's would send traffic to one release in a rollout)."""
    problems = []
    for obj in base.workloads():
        name = obj["metadata"]["name"]
        for where, labels in (
            ("", obj["metadata"].get("labels", {})),
            ("pod template ", obj["spec"]["template"]["metadata"].get("labels", {})),
        ):
            if labels.get(VERSION_LABEL) != VERSION:
                problems.append(
                    f"{name}: {where}{VERSION_LABEL} {labels.get(VERSION_LABEL)!r}, not {VERSION}"
                )
        if VERSION_LABEL in obj["spec"].get("selector", {}).get("matchLabels", {}):
            problems.append(f"{name}: its selector names the version")
        for claim in obj["spec"].get("volumeClaimTemplates", []):
            if VERSION_LABEL in claim["metadata"].get("labels", {}):
                problems.append(
                    f"{name}: volume claim template {claim['metadata']['name']} names the version"
                )
        for container in _pod(obj)["containers"] + _pod(obj).get("initContainers", []):
            if container["image"].rpartition(":")[2] != VERSION:
                problems.append(
                    f"{name}/{container['name']}: image {container['image']}, not tagged {VERSION}"
                )
    for kind in ("Service", "PodDisruptionBudget"):
        for obj in base.of_kind(kind):
            if obj["spec"].get("selector") and VERSION_LABEL in _selector(obj):
                problems.append(f"{kind}/{obj['metadata']['name']}: its selector names the version")
    return problems


def provisioning_problems(base: Rendered) -> list[str]:
    """One Job runs `crashsafe infra apply` (additive: creates what is missing, never deletes or rewrites), and no
    container of the base runs a contracting step: `crashsafe infra contract` is the operator's, once no older
    release is left (docs/upgrading.md)."""
    problems = []
    applies = [
        j
        for j in base.of_kind("Job")
        if any(c.get("args") == ["infra", "apply"] for c in _pod(j)["containers"])
    ]
    if len(applies) != 1:
        problems.append(f"{len(applies)} Jobs run `crashsafe infra apply`, not 1")
    for obj in base.workloads():
        for container in _pod(obj)["containers"] + _pod(obj).get("initContainers", []):
            if "contract" in [*container.get("command", []), *container.get("args", [])]:
                problems.append(f"{obj['metadata']['name']}/{container['name']}: runs a contracting step")
    return problems


RULES: list[Rule] = [
    schema_problems,
    probe_problems,
    credential_problems,
    security_problems,
    executor_problems,
    selector_problems,
    variable_problems,
    network_problems,
    rollout_problems,
    disruption_problems,
    version_problems,
    provisioning_problems,
]


@pytest.mark.parametrize("rule", RULES, ids=[r.__name__ for r in RULES])
def test_the_base_keeps_the_rule(rule: Rule, rendered: Rendered) -> None:
    assert rule(rendered) == []


def test_the_base_has_every_component(rendered: Rendered) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in rendered.objects}
    assert {
        ("Namespace", "crashsafe"),
        ("Deployment", "gateway"),
        ("Service", "gateway"),
        ("HorizontalPodAutoscaler", "gateway"),
        ("PodDisruptionBudget", "gateway"),
        ("Deployment", "runtime"),
        ("PodDisruptionBudget", "runtime"),
        ("Deployment", "reconciler"),
        ("PodDisruptionBudget", "reconciler"),
        ("Deployment", "projector"),
        ("PodDisruptionBudget", "projector"),
        ("Job", "crashsafe-infra-apply"),
        ("ConfigMap", "crashsafe-config"),
        ("ConfigMap", "nats-auth"),
        ("NetworkPolicy", "default-deny-ingress"),
        ("NetworkPolicy", "nats-clients"),
    } <= kinds
    assert rendered.get("Deployment", "gateway")["spec"]["replicas"] == 2
    assert rendered.get("Deployment", "runtime")["spec"]["replicas"] == 2
    assert all(
        o["metadata"].get("namespace") == "crashsafe" for o in rendered.objects if o["kind"] != "Namespace"
    )
    images = {c["image"] for o in rendered.workloads() for c in _pod(o)["containers"]}
    assert images == {f"registry.example.com/crashsafe:{VERSION}"}
    assert rendered.kustomization["images"][0]["newTag"] == VERSION


def test_the_config_is_one_the_services_accept(rendered: Rendered) -> None:
    data = rendered.get("ConfigMap", "crashsafe-config")["data"]
    settings = Settings.from_env(data)
    assert settings.nats_url == "nats://nats:4222" and settings.stream_replicas == 3
    assert data["CRASHSAFE_OPS_HOST"] == "0.0.0.0" and data["CRASHSAFE_OPS_PORT"] == str(OPS_PORT)


def test_the_generated_files_are_what_the_generators_write_and_never_committed(
    rendered: Rendered, tmp_path: Path
) -> None:
    """Run the commands infra/README.md gives (nats-auth, capability-key new) into a copy's secrets/: every file
    a generator of the base reads is then there; and secrets/ is git-ignored."""
    assert all(path.startswith("secrets/") for path in rendered.generated_files)
    assert "secrets/" in (BASE / ".gitignore").read_text().split()
    config = rendered.get("ConfigMap", "crashsafe-config")["data"]
    secrets = tmp_path / "secrets"
    assert (
        infra_nats_auth(
            secrets / "nats-auth",
            config["CRASHSAFE_NAMESPACE"],
            config["CRASHSAFE_REGISTRY"],
            int(config["CRASHSAFE_ACTION_PARTITIONS"]),
        )
        == 0
    )
    write_key_pair(secrets / "capability.key")
    (secrets / "synthetic-api-key").write_text("the key `crashsafe keys create` printed")
    missing = [path for path in rendered.generated_files if not (tmp_path / path).is_file()]
    assert missing == []


def test_the_nats_chart_values_include_the_generated_users_where_they_are_mounted(rendered: Rendered) -> None:
    """nats-values.yaml: 3 replicas, clustered JetStream on a file store with a PVC, and an include of auth.conf
    that resolves (from the chart's /etc/nats-config) to the file of the `nats-auth` ConfigMap's mount."""
    values = yaml.safe_load((BASE / "nats-values.yaml").read_text())
    config = values["config"]
    assert config["cluster"]["enabled"] is True and config["cluster"]["replicas"] == 3
    store = config["jetstream"]
    assert store["enabled"] and store["fileStore"]["enabled"] and store["fileStore"]["pvc"]["enabled"]
    includes = [v for k, v in config["merge"].items() if k.endswith("$include")]
    assert len(includes) == 1
    included = posixpath.normpath(posixpath.join("/etc/nats-config", includes[0]))
    mount = next(p["value"] for p in values["container"]["patch"] if p["path"] == "/volumeMounts/-")
    volume = next(p["value"] for p in values["podTemplate"]["patch"] if p["path"] == "/spec/volumes/-")
    assert mount["name"] == volume["name"]
    assert included == posixpath.join(mount["mountPath"], "auth.conf")
    made = rendered.get("ConfigMap", volume["configMap"]["name"])
    assert "auth.conf" in made["data"]


def test_the_dockerfile_runs_the_user_the_pods_require(rendered: Rendered) -> None:
    text = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", text, re.MULTILINE)
    assert user is not None
    uids = {_pod(o)["securityContext"]["runAsUser"] for o in rendered.workloads()}
    assert uids == {int(user.group(1))}
    assert 'ENTRYPOINT ["crashsafe"]' in text and 'CMD ["serve", "gateway"]' in text
    assert '"crashsafe[otel]"' in text and "[dev]" not in text
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)


# The rules have teeth: each catches its own kind of breakage. ----------------------------------------------------


def _broken(rendered: Rendered, kind: str, name: str, change: Callable[[dict[str, Any]], None]) -> Rendered:
    objects = copy.deepcopy(rendered.objects)
    change(next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name))
    return Rendered(rendered.kustomization, objects, rendered.generated_files)


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["template"]["spec"]["containers"][0])


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        target: Any = obj
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return change


CONTAINER: list[str | int] = ["spec", "template", "spec", "containers", 0]


def _mount_secret(secret: str) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        obj["spec"]["template"]["spec"]["volumes"].append(
            {"name": "stolen", "secret": {"secretName": secret}}
        )

    return change


def _drop_executor(obj: dict[str, Any]) -> None:
    obj["kind"] = "Deployment"
    obj["spec"].pop("volumeClaimTemplates")
    obj["spec"].pop("serviceName")


def _open_to_all(obj: dict[str, Any]) -> None:
    obj["spec"]["ingress"][0].pop("from")


def _one_available(obj: dict[str, Any]) -> None:
    obj["spec"].pop("maxUnavailable")
    obj["spec"]["minAvailable"] = 1


BREAKAGES = {
    "NATS open to every pod in the cluster": (
        network_problems,
        "NetworkPolicy",
        "nats-clients",
        _open_to_all,
    ),
    "the ops port open to anyone": (network_problems, "NetworkPolicy", "ops-scrape", _open_to_all),
    "an unknown field": (schema_problems, "Deployment", "gateway", _set(["spec", "replica"], 2)),
    "a probe on an undeclared port": (
        probe_problems,
        "Deployment",
        "runtime",
        _set([*CONTAINER, "readinessProbe", "httpGet", "port"], 9999),
    ),
    "liveness asking /readyz": (
        probe_problems,
        "StatefulSet",
        "executor-payment",
        _set([*CONTAINER, "livenessProbe", "httpGet", "path"], "/readyz"),
    ),
    "the runtime mounting an executor's credential": (
        credential_problems,
        "Deployment",
        "runtime",
        _mount_secret("nats-creds-executor-payment"),
    ),
    "a gateway with the signing key": (
        credential_problems,
        "Deployment",
        "gateway",
        _mount_secret("crashsafe-capability-signing-key"),
    ),
    "a key file outside its mount": (
        credential_problems,
        "Deployment",
        "reconciler",
        _set([*CONTAINER, "env", 3, "value"], "/var/run/crashsafe/keys/api-key"),
    ),
    "a projector with the operator's credential": (
        credential_problems,
        "Deployment",
        "projector",
        _mount_secret("nats-creds-operator"),
    ),
    "a pod allowed to run as root": (
        security_problems,
        "Deployment",
        "reconciler",
        _set(["spec", "template", "spec", "securityContext", "runAsNonRoot"], False),
    ),
    "a writable root": (
        security_problems,
        "StatefulSet",
        "executor-booking",
        _set([*CONTAINER, "securityContext", "readOnlyRootFilesystem"], False),
    ),
    "an executor serving another family": (
        executor_problems,
        "StatefulSet",
        "executor-notify",
        _set([*CONTAINER, "args"], ["serve", "executor", "--tool", "payment"]),
    ),
    "an executor without its volumes": (executor_problems, "StatefulSet", "executor-memory", _drop_executor),
    "a registry the executors do not match": (
        executor_problems,
        "ConfigMap",
        "crashsafe-config",
        _set(["data", "CRASHSAFE_REGISTRY"], "bench.workloads:registry"),
    ),
    "a PDB selecting nothing": (
        selector_problems,
        "PodDisruptionBudget",
        "runtime",
        _set(["spec", "selector", "matchLabels", "app.kubernetes.io/component"], "runtimes"),
    ),
    "a misspelt setting": (
        variable_problems,
        "ConfigMap",
        "crashsafe-config",
        _set(["data", "CRASHSAFE_STREAM_REPLICA"], "3"),
    ),
    "an old pod stopped before a new one is ready": (
        rollout_problems,
        "Deployment",
        "runtime",
        _set(["spec", "strategy", "rollingUpdate", "maxUnavailable"], 1),
    ),
    "a canary partition left in the base": (
        rollout_problems,
        "StatefulSet",
        "executor-payment",
        _set(["spec", "updateStrategy"], {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}),
    ),
    "a new pod counted as soon as it is ready": (
        rollout_problems,
        "Deployment",
        "gateway",
        _set(["spec", "minReadySeconds"], 0),
    ),
    "a runtime killed before its model call can end": (
        rollout_problems,
        "Deployment",
        "runtime",
        _set(["spec", "template", "spec", "terminationGracePeriodSeconds"], 30),
    ),
    "a singleton whose budget blocks every drain": (
        disruption_problems,
        "PodDisruptionBudget",
        "reconciler",
        _one_available,
    ),
    "a Deployment no budget covers": (
        disruption_problems,
        "PodDisruptionBudget",
        "projector",
        _set(["spec", "selector", "matchLabels", "app.kubernetes.io/component"], "projectors"),
    ),
    "a budget that keeps pods that are not ready": (
        disruption_problems,
        "PodDisruptionBudget",
        "executor-booking",
        _set(["spec", "unhealthyPodEvictionPolicy"], "IfHealthyBudget"),
    ),
    "pods labelled with another release": (
        version_problems,
        "Deployment",
        "gateway",
        _set(["spec", "template", "metadata", "labels", VERSION_LABEL], "0.1.0"),
    ),
    "an image of another release": (
        version_problems,
        "Deployment",
        "projector",
        _set([*CONTAINER, "image"], "registry.example.com/crashsafe:0.1.0"),
    ),
    "a Service that selects one release": (
        version_problems,
        "Service",
        "gateway",
        _set(["spec", "selector", VERSION_LABEL], VERSION),
    ),
    "the version on a volume claim template": (
        version_problems,
        "StatefulSet",
        "executor-notify",
        _set(["spec", "volumeClaimTemplates", 0, "metadata", "labels", VERSION_LABEL], VERSION),
    ),
    "a Job that contracts": (
        provisioning_problems,
        "Job",
        "crashsafe-infra-apply",
        _set([*CONTAINER, "args"], ["infra", "contract"]),
    ),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_base_is_caught(breakage: str, rendered: Rendered) -> None:
    rule, kind, name, change = BREAKAGES[breakage]
    assert rule(rendered) == []
    assert rule(_broken(rendered, kind, name, change)) != []

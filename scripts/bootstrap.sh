# Sourced by scripts/run, scripts/serve and scripts/test: make .venv match requirements.lock.
# uv installs the locked set; plain pip is the fallback when uv cannot be fetched.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
# uv does not compile at install, so with PYTHONDONTWRITEBYTECODE set (some machines set it) every
# run would recompile every import without .pyc files.
unset PYTHONDONTWRITEBYTECODE
PYTHON=${PYTHON:-$(command -v python3)}
if [ ! -x "$ROOT/.ci-tools/bin/uv" ]; then
  "$PYTHON" -m pip install -q --disable-pip-version-check --target "$ROOT/.ci-tools" uv >/dev/null 2>&1 || true
fi
if [ -x "$ROOT/.ci-tools/bin/uv" ]; then
  [ -x "$ROOT/.venv/bin/python" ] || "$ROOT/.ci-tools/bin/uv" venv -q -p "$PYTHON" "$ROOT/.venv"
  "$ROOT/.ci-tools/bin/uv" pip install -q -p "$ROOT/.venv/bin/python" -r "$ROOT/requirements.lock"
else
  [ -x "$ROOT/.venv/bin/python" ] || "$PYTHON" -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/pip" install -q -r "$ROOT/requirements.lock"
fi
VPY="$ROOT/.venv/bin/python"

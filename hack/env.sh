# Sourced by the hack/ scripts: the tools hack/install-deps.sh put in the repository's
# virtualenv come first on PATH.
_gs_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$_gs_repo/.venv/bin:$PATH"
unset _gs_repo

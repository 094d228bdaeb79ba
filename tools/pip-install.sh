#!/usr/bin/env bash
# `make run`'s install, said as it goes: one line per requirement pip collects and one when it installs them, not
# 76 s of silence; setuptools' "Editable installation" warning box (a note for package authors, printed once per
# editable install) left out. pip's own errors still reach stderr, and its exit status is this script's.
#
#   tools/pip-install.sh <pip> <pip install arguments...>
set -euo pipefail
pip=$1
shift
echo "installing into $(dirname "$(dirname "$pip")") (about a minute the first time; once after a pyproject change)"
set +e
PYTHONWARNINGS="ignore:Editable installation" "$pip" install --progress-bar off "$@" \
  | grep --line-buffered -E '^(Collecting|Installing collected packages|Successfully installed)' \
  | sed -u -E 's/^Collecting ([^ ]+).*/  collecting \1/; s/^Installing collected packages.*/  installing them.../;
      s/^Successfully installed.*/  installed/'
status=("${PIPESTATUS[@]}")
exit "${status[0]}"

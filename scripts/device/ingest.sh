#!/usr/bin/env bash
# Here, after the device sessions: what their calls brought home (DIR: turn.sh's <step>.tgz, each
# with host/, plan.log, steps.tsv; the newest of each) made into the results folder to commit,
# results/<card>-<date>/ (the card from the journey's host record, else doctor's; the date of the
# first session): each step's directory without tensors, caches or report.html, the journey's
# report.md and charts rendered here, plan.log, steps.tsv, the host records, and a NOTES.md
# skeleton with each step's command, card, minutes and exit code. Then it prints what to run next.
#   bash scripts/device/ingest.sh DIR [DEST]       from the checkout root (PY: the venv's python)
set -euo pipefail
[ -f "${1:-}/steps.tsv" ] || { echo "error: no steps.tsv in '${1:-}': not what turn.sh's calls bring home" >&2
                               echo "  fix: bash scripts/device/ingest.sh .devback (the folder the calls' files were copied into)" >&2; exit 2; }
src=$(cd "$1" && pwd)
PY=${PY:-.venv/bin/python}
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
for f in "$src"/*.tgz; do tar xzf "$f" -C "$tmp"; done

gpu=$("$PY" - "$tmp" <<'PY'
import glob, json, sys
tmp = sys.argv[1]
try:
    name = json.load(open(f"{tmp}/journey/run.json"))["env"].get("gpu")
except (OSError, ValueError, KeyError):
    name = None
for f in sorted(glob.glob(f"{tmp}/host/doctor-*.json")):
    name = name or next((d["name"] for d in json.load(open(f))["gpu"]["devices"]), None)
print(name or "CPU")
PY
)
case $gpu in *H100*) card=h100 ;; *H200*) card=h200 ;; CPU) card=cpu ;; *) card=$(echo "$gpu" | tr 'A-Z ' 'a-z-') ;; esac
date=$(awk -F'\t' 'NR == 1 {print substr($1, 1, 8)}' "$src/steps.tsv"); date=${date:-$(date -u +%Y%m%d)}
dest=${2:-results/$card-$date}
mkdir -p "$dest"

for d in "$tmp"/*/; do
  step=$(basename "$d")
  [ "$step" = host ] && { mkdir -p "$dest/host" && cp "$d"/*.json "$d"/*.csv "$d"/*.log "$dest/host/" 2>/dev/null || true; continue; }
  rm -rf "${dest:?}/$step" && mkdir -p "$dest/$step"
  tar cf - -C "$d" --exclude='*.pt' --exclude='*.safetensors' --exclude='report.html' --exclude='*.lock' . | tar xf - -C "$dest/$step"
  [ -f "$tmp/$step.log" ] && cp "$tmp/$step.log" "$dest/$step/console.log"
done
cp "$src/plan.log" "$src/steps.tsv" "$dest/"
[ -f "$dest/journey/run.json" ] && "$PY" -m llmopt_bench report "$dest/journey" --format md >/dev/null

# smaller to commit, the verdicts unchanged (results/h100-20261206/NOTES.md checked it with --rejudge):
# vLLM's client results without the generated texts and with times rounded to 1 us; logs over
# 1 MB cut to their first and last 2000 lines
"$PY" - "$dest" <<'PY'
import glob, json, os, sys
dest = sys.argv[1]
def us(x):
    return [us(v) for v in x] if isinstance(x, list) else round(x, 6) if isinstance(x, float) else x
for f in glob.glob(f"{dest}/**/*.json", recursive=True):  # vLLM's own result files, wherever a step keeps them
    d = json.load(open(f))
    if isinstance(d, dict) and ("generated_texts" in d or "itls" in d):
        d.pop("generated_texts", None)
        d.update({k: us(d[k]) for k in ("itls", "ttfts", "latencies", "start_times", "queue_times") if k in d})
        json.dump(d, open(f, "w"))
for f in glob.glob(f"{dest}/**/*.log", recursive=True):
    if os.path.getsize(f) > 1_000_000:
        lines = open(f, errors="replace").read().splitlines()
        cut = len(lines) - 4000
        if cut > 0:
            open(f, "w").write("\n".join(lines[:2000] + [f"[... {cut} lines cut by ingest.sh ...]"] + lines[-2000:]) + "\n")
PY

# NOTES.md: a skeleton; the figures and what they mean are written by hand from the reports
notes=$dest/NOTES.md
[ -e "$notes" ] && notes=$dest/NOTES.skeleton.md  # never over notes already written
"$PY" - "$dest" "$gpu" > "$notes" <<'PY'
import csv, glob, json, os, sys
dest, gpu = sys.argv[1:]
rows = list(csv.reader(open(f"{dest}/steps.tsv"), delimiter="\t"))
doctor = next((json.load(open(f)) for f in sorted(glob.glob(f"{dest}/host/doctor-*.json"))), {})
runs = [json.load(open(f)) for f in sorted(glob.glob(f"{dest}/*/run.json"))]
env = runs[0]["env"] if runs else {}
versions = env.get("versions") or {}
driver = env.get("driver") or (doctor.get("gpu") or {}).get("driver") or "?"
commits = sorted({r["env"].get("llmopt_commit") for r in runs} - {None})
models = sorted({r["model"]["source"] for r in runs})
print(f"# {gpu}, {rows[0][0][:8] if rows else '?'}: this turn's GPU evidence (issue 44)\n")
print(f"{gpu} (driver {driver}; `host/`), vLLM {versions.get('vllm', '?')} and torch {versions.get('torch', '?')}"
      f"{'+cu' + env['torch_cuda'] if env.get('torch_cuda') else ''}, llmopt at {', '.join(commits) or '?'} "
      f"(scripts/device/turn.sh, sessions {', '.join(sorted({r[0] for r in rows}))}). Models: {', '.join(models) or '?'}; "
      "synthetic ones have random weights: speed only, quality not judged.\n")
print("vLLM's client results are slimmed (generated texts dropped, times rounded to 1 us) and logs over 1 MB "
      "cut to their first and last 2000 lines (scripts/device/ingest.sh).\n")
print("## What ran (`steps.tsv`, `plan.log`)\n")
print("| session | step | state | exit | minutes | command |\n| --- | --- | --- | --- | --- | --- |")
for session, step, state, rc, secs, command in rows:
    print(f"| {session} | {step} | {state} | {rc} | {int(secs) / 60:.1f} | `{command}` |")
done = {r[1] for r in rows if r[2] == "done"}
left = {r[1]: r for r in rows if r[1] not in done}
if left:
    print("\n## Not run yet (the next session: scripts/device/pack.sh --back, scripts/device/CALLS.md)\n")
    for step, r in left.items():
        print(f"- {step}: {r[5]}")
for step in ("journey", "tune", "tune-smollm2", "capacity", "capacity-binding", "oneclock"):
    if os.path.isdir(f"{dest}/{step}"):
        files = ", ".join(sorted(f for f in os.listdir(f"{dest}/{step}") if f.endswith((".md", ".json")))[:6])
        print(f"\n## {step} ({files})\n\nTODO: what it measured, against the earlier runs.")
PY

slugify() { tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//'; }  # scripts/maintainers/nightly.sh's
slug=$(echo "$gpu" | slugify)-$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["model"]["source"])' "$dest/journey/run.json" 2>/dev/null | slugify)
echo "wrote $dest ($(du -sh "$dest" | cut -f1)): $(ls "$dest" | tr '\n' ' ')"
echo "notes: $notes"
if [ -f "$dest/journey/run.json" ]; then
  cat <<EOF

Next, here:
  1. the baseline and its gate file (review the run first; the nightly's way, scripts/maintainers/nightly.sh --init-baseline):
       cp $dest/journey/run.json results/baselines/$slug.json && $PY scripts/gate/gate-file.py results/baselines/$slug.json
  2. the gate on it, as the nightly calls it on a fresh machine (no history): 0 wanted
       LLMOPT_HISTORY_DB=\$(mktemp -u).sqlite llmopt compare results/baselines/$slug.json $dest/journey \\
         --output $dest/journey/compare.md --drift results/baselines/drift.toml; echo "exit \$?"
  3. the README's measured tables and "What to deploy" from $dest/journey/report.md and
       llmopt recommend $dest/journey
  4. NOTES.md's TODOs; tune.md's "not judged" on random weights (README too)
EOF
fi

"""vLLM's own client, `vllm bench serve`, run in one place: its arguments for the same load as
llmopt's (the same prompts and output length, the same sampling, the same request body), the
one runner (BenchServe: a long-lived process of vLLM's interpreter, started through
procs/spawn.py, that calls vLLM's own `vllm bench serve` main once a run, so a run does not wait
for vLLM to import), and the one reader of the result it saves (saved_result).

vLLM's CustomDataset (vllm/benchmarks/datasets: `--dataset-name custom`) reads a .jsonl file
with a "prompt" string per line and an optional "output_tokens" integer, which
`--custom-output-len` overrides; it applies the tokenizer's chat template unless
`--skip-chat-template` and shuffles unless `--disable-shuffle`. vLLM's client sends text, which
the server tokenizes itself, so for a like-for-like comparison llmopt sends the same text too
(export_custom_dataset returns it): token-id prompts would skip the server's tokenizer and its
BOS token. The texts are llmopt's of the asked length (workloads/text.py), so both clients send
what the workload states; the requests' sampling (core/workload.Sampling) goes to vLLM's client
as its own options, so both bodies carry the same fields. Its arrival times come from numpy's
generator, so the two clients send the same rate and distribution, not the same instants."""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmopt_bench.client.server_clock import ServerClock
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.workload import Request, Sampling
from llmopt_bench.procs import spawn
from llmopt_bench.procs.tree import PGRP


def export_custom_dataset(requests: Sequence[Request], text_of: Callable[[list[int]], str], path: Path,
                          output_len: int) -> list[str]:
    """Write the requests' prompts (text_of their token ids: workloads/text.PromptTexts.text, of
    the asked length) as a custom dataset; returns the prompt texts in file order, for llmopt's
    client to send the same strings."""
    path = Path(path)
    if path.suffix != ".jsonl":
        raise UsageError(f"{path}: vLLM's custom dataset must be a .jsonl file", "name the file with a .jsonl suffix")
    texts = [text_of(list(r.token_ids)) for r in requests]
    empty = [r.id for r, t in zip(requests, texts) if not t.strip()]
    if empty:
        raise UsageError(f"prompts {', '.join(empty[:5])} decode to empty text: vLLM's client cannot send them")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"prompt": text, "output_tokens": output_len}, ensure_ascii=False) + "\n")
    return texts


def custom_args(base_url: str, model: str, dataset: Path, num_prompts: int, output_len: int, **kw: Any) -> list[str]:
    """`vllm bench serve`'s arguments for llmopt's own prompts (export_custom_dataset's file), in
    file order; kw as bench_args."""
    data = ["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", str(output_len),
            "--skip-chat-template", "--disable-shuffle"]
    return bench_args(base_url, model, data, num_prompts, **kw)


def random_args(base_url: str, model: str, input_len: int, output_len: int, num_prompts: int, **kw: Any) -> list[str]:
    """`vllm bench serve` on its own random dataset (random token ids decoded and adjusted until
    the text re-tokenizes to input_len, output_len out, forced): vLLM's client as a user would run
    it (tune's confirmation, `llmopt check capacity`); kw as bench_args."""
    data = ["--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len)]
    return bench_args(base_url, model, data, num_prompts, **kw)


def bench_args(base_url: str, model: str, data: list[str], num_prompts: int, *, tokenizer: str | None = None,
               rate: float | None = None, burstiness: float = 1.0, concurrency: int | None = None, seed: int = 0,
               warmups: int = 0, extra_body: dict | None = None, sampling: Sampling | None = None) -> list[str]:
    """The arguments after `vllm bench serve`: completions endpoint, the same sampling (default
    greedy), the output length forced with ignore_eos, every percentile an SLO may name.
    extra_body: fields added to each request (`--extra-body`), so that both clients send the same
    body: vLLM's server holds back a chunk whose text is empty (a token that ends mid-character)
    unless token ids are asked for, so "first chunk" means "first token" only with the same ask."""
    # vLLM's client sends only the sampling fields it is given (since 0.26 no temperature by default):
    # every one of llmopt's is given, so both clients' requests sample alike
    args = ["--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, *data, "--num-prompts", str(num_prompts), "--ignore-eos", *(sampling or Sampling()).bench_serve_args(),
            "--seed", str(seed), "--request-rate", "inf" if rate is None else f"{rate:g}", "--burstiness", f"{burstiness:g}",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99", "--num-warmups", str(warmups)]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    if concurrency is not None:
        args += ["--max-concurrency", str(concurrency)]
    if extra_body:
        args += ["--extra-body", json.dumps(extra_body, sort_keys=True)]
    return args


def saved_result(run_dir: Path) -> dict | None:
    """The result `vllm bench serve --save-result` wrote last in run_dir (None: none)."""
    saved = max(Path(run_dir).glob("*.json"), key=lambda p: p.stat().st_mtime, default=None)
    return json.loads(saved.read_text()) if saved else None


# Runs in vLLM's interpreter (which may not have llmopt): vLLM's `vllm bench serve` is this parser
# and this main (entrypoints/cli/benchmark/serve.py), called once a line of stdin, each call's
# output into the log it names; "ready" and "done CODE CPU_S" on the event pipe (argv[1]), CPU_S
# the process's CPU seconds inside vLLM's benchmark() alone (its load, without its start-up and
# prompt making: what `llmopt check client` sets beside llmopt's own CPU time over its load point).
DRIVER = r"""
import json, os, resource, sys, traceback
events = os.fdopen(int(sys.argv[1]), "w", buffering=1)
import vllm.benchmarks.serve as serve
from vllm.benchmarks.serve import add_cli_args, main
cpu = [0.0]
inner = getattr(serve, "benchmark", None)  # a vLLM without it: no CPU figure ("-")
def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
async def timed(*a, **k):
    t = cpu_s()
    try:
        return await inner(*a, **k)
    finally:
        cpu[0] += cpu_s() - t
if inner is not None:
    serve.benchmark = timed
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # older vLLM
    from vllm.utils import FlexibleArgumentParser
events.write("ready\n")
out, err = os.dup(1), os.dup(2)
for line in sys.stdin:
    call = json.loads(line)
    code, cpu[0] = 1, 0.0
    with open(call["log"], "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            p = FlexibleArgumentParser()
            add_cli_args(p)
            main(p.parse_args(call["args"]))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(out, 1)
            os.dup2(err, 2)
    events.write(f"done {code} {cpu[0]:.4f}\n" if inner is not None else f"done {code} -\n")
"""


@dataclass
class BenchRun:
    """One `vllm bench serve` run: its command (as a user types it), the result it saved (None:
    none, `error` says why), and the server's own clock over its requests where it was read."""

    command: str
    result: dict | None
    error: str | None = None
    server_clock: ServerClock | None = None
    cpu_s: float | None = None  # its process's CPU seconds inside its benchmark() (the load alone)


class BenchServe:
    """with BenchServe(log_path) as bench: bench.run(args, out_dir, timeout_s) ...

    vLLM's own client in one long-lived process of vLLM's interpreter (LLMOPT_VLLM_PYTHON, else
    this one), started on the first run and again after a run it had to kill (past its time). It
    runs in llmopt's session, in a process group of its own (killed whole): in the scheduling
    group of llmopt's client and of the server llmopt started, as a user's `vllm bench serve`
    in the server's shell would be; in a session of its own a busy host keeps it off the CPU for
    whole answers, and it reads every token of one at once (on 2 shared cores: TTFT 26 ms for the
    server's 4, TPOT 0.007 ms). The server's key, where it has one, travels as OPENAI_API_KEY in
    the process's environment, never in its arguments."""

    def __init__(self, log_path: Path, *, api_key_env: str | None = None, python: str | None = None,
                 start_timeout_s: float = 300.0):
        self.log_path, self.api_key_env, self.start_timeout_s = Path(log_path), api_key_env, start_timeout_s
        self._python = python
        self.proc: subprocess.Popen | None = None
        self._events: Any = None

    @property
    def python(self) -> str:
        from llmopt_bench.engines.vllm.server import vllm_python

        return self._python or vllm_python()

    def _start(self) -> None:
        env = dict(os.environ)
        if self.api_key_env:
            env["OPENAI_API_KEY"] = os.environ.get(self.api_key_env, "")
        read, write = os.pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = spawn.start([self.python, "-c", DRIVER, str(write)], log=log, env=env, pass_fds=(write,),
                                    stdin=subprocess.PIPE, own_session=False, own_group=True)
        os.close(write)
        self._events = os.fdopen(read)
        said = self._next(self.start_timeout_s)
        if said != "ready":
            self.close(kill=True)
            raise UsageError(f"vLLM's client (vllm bench serve) did not start in {self.python}: see {self.log_path}",
                             "point LLMOPT_VLLM_PYTHON at an interpreter with vLLM (make vllm-venv)")

    def _next(self, timeout_s: float) -> str | None:
        """The driver's next event; None when it ended or the time ran out."""
        ready, _, _ = select.select([self._events], [], [], max(0.0, timeout_s))
        line = self._events.readline() if ready else ""
        return line.strip() or None

    def run(self, args: list[str], out: Path, timeout_s: float, metrics_url: str | None = None,
            headers: dict[str, str] | None = None, save: bool = True) -> BenchRun:
        """`vllm bench serve ARGS` into out/ (command.txt, stdout.log, its saved result with every
        request's figures when `save`); with metrics_url, the server's own clock (its /metrics,
        client/server_clock.py) read around the run and reconciled with its requests."""
        from llmopt_bench.client.server_clock import MetricsPage, ServerWatch
        from llmopt_bench.scenarios.peer.judge import bench_samples

        out.mkdir(parents=True, exist_ok=True)
        if save:
            args = [*args, "--save-result", "--save-detailed", "--result-dir", str(out)]
        command = "vllm bench serve " + shlex.join(args)
        (out / "command.txt").write_text(command + "\n")
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        watch = ServerWatch(MetricsPage(metrics_url, headers)) if metrics_url else None
        if watch:
            watch.start()
        t0 = time.monotonic()
        self.proc.stdin.write((json.dumps({"args": args, "log": str(out / "stdout.log")}) + "\n").encode())
        self.proc.stdin.flush()
        said = self._next(timeout_s)
        error = None
        if said is None:
            self.close(kill=True)
            error = (f"vllm bench serve ran past {timeout_s:g} s" if time.monotonic() - t0 >= timeout_s else
                     f"vllm bench serve's process ended: see {self.log_path}")
        elif not said.startswith("done 0"):
            error = f"vllm bench serve failed: see {out / 'stdout.log'}"
        words = (said or "").split()
        cpu = float(words[2]) if len(words) == 3 and words[2] != "-" else None
        result = saved_result(out) if save and error is None else None
        if save and error is None and result is None:
            error = f"vllm bench serve saved no result in {out}: see {out / 'stdout.log'}"
        clock = None
        if watch:
            clock, _ = watch.stop(bench_samples(result) if result else [], **({} if result else {"settle_s": 0}))
        return BenchRun(command=command, result=result, error=error, server_clock=clock, cpu_s=cpu)

    def close(self, kill: bool = False) -> None:
        """End the process (its stdin closed, it finishes; killed whole when `kill` or when it
        does not within 30 s) and its pipe."""
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                if kill:
                    raise OSError("killed")
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                spawn.signal_all(proc.pid, signal.SIGKILL, PGRP)
                proc.wait()
        if self._events is not None:
            self._events.close()
            self._events = None

    def __enter__(self) -> BenchServe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

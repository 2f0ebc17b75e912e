"""The library matrix (``make test-libraries``): each library's trainers, on transformers' Trainer and on cadence's
(``cadence.patch_transformers()`` before the library is imported), compared run against run.

Per library and trainer, ``worker.py`` trains a tiny model 4 steps, evaluating and saving at steps 2 and 4; then
cadence's run is resumed from its ``checkpoint-2``. The columns:

- start: the run on cadence ran to its end (or the error's last line; "fails on transformers too" when the library
  fails on its own base: a library limitation, not cadence's);
- dloss: the largest |difference| between transformers' and cadence's logged training losses (every step's
  ``loss``, ``train_loss``, the library's own ``*loss*`` keys);
- deval: the same for the evaluation losses (``eval_*loss*`` at steps 2 and 4; the eval set is one batch, where
  cadence's item-weighted eval loss and transformers' row-weighted batch means are the same number);
- dw: the largest |difference| of the final weights;
- resume: cadence's run resumed from checkpoint-2 against its unbroken run: "bit-identical" (weights and every
  value logged after step 2, times aside) or the differences; a logged value that transformers' resumed run gets
  wrong the same way (a library counter its checkpoint does not hold) is named, and not held against cadence;
- 2 processes (``--two-processes``): cadence on 2 processes (torchrun, 2 rows each) against transformers on the same
  2 processes: the largest |difference| of training losses and weights (eval losses aside: on 2 processes
  transformers averages the processes' batch means by rows, cadence weighs by items, as documented); a library
  whose ``TRANSFORMERS_TWO_PROCESSES`` says why transformers' own 2-process run is biased is held to transformers'
  1-process run instead (its tiny model has no dropout, so 2 processes train as one);
- verdict: "equal" when dloss and dw are within 1e-5 (1e-3 where the run is bf16, which TRL's configs choose on CPUs
  that have it), the other logged numbers too, and the resume is bit-identical.

Libraries whose pins conflict with the main test set run in their own venvs, ``.venv-libs/NAME``, built from
``libraries/NAME.txt`` (rebuilt when it or pyproject.toml changes); the rest run in ``--python`` (the main pins).

    .venv/bin/python scripts/libraries/run.py                      # everything but the 2-process column
    .venv/bin/python scripts/libraries/run.py --two-processes      # with it
    .venv/bin/python scripts/libraries/run.py --only trl:sft,dpo --only sentence-transformers
    .venv/bin/python scripts/libraries/run.py --fast               # CI's slice: main pins, a few trainers
    .venv/bin/python scripts/libraries/run.py --render             # docs/libraries-matrix.md from the JSON only
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

# library (as its package is named) -> its module here, and the venv of its pins (None: the main test set)
LIBRARIES = {
    "trl": ("trl", None),
    "sentence-transformers": ("st", None),
    "setfit": ("setfit", "setfit"),
    "gliner": ("gliner", "gliner"),
    "pylate": ("pylate", "pylate"),
    "span-marker": ("span_marker", "span_marker"),
    # the libraries of the main pins again, on transformers 4.57 (the `hf` extra's floor)
    "trl@4.57": ("trl", "transformers_4_57"),
    "sentence-transformers@4.57": ("st", "transformers_4_57"),
}
# what each venv installs beside cadence (``pip install -c libraries/NAME.txt -e . PACKAGES``)
VENV_PACKAGES = {"setfit": ["setfit", "datasets"], "gliner": ["gliner", "datasets"],
                 "pylate": ["pylate", "datasets"], "span_marker": ["span_marker", "datasets"],
                 "transformers_4_57": ["trl", "sentence-transformers", "datasets"]}
TORCH = os.environ.get("TORCH", "torch==2.13.0")  # the CPU build on these machines' disk, as the Makefile's TORCH
FAST = {"trl": ["sft", "dpo"], "sentence-transformers": ["sentence_transformer"]}
# the 2-process column's rows (torchrun launches cost minutes on a shared 2-core machine)
TWO_PROCESS_CASES = {"trl": ["sft", "dpo"], "sentence-transformers": ["sentence_transformer", "cross_encoder"],
                     "span-marker": ["span_marker"]}
TIMES = {"step_time"}  # timings, never compared, with every *_runtime and *_per_second key (see is_time)
TOL, TOL_BF16 = 1e-5, 1e-3
COLUMNS = ["library", "version", "transformers", "trainer", "start", "dloss", "deval", "dw", "resume", "2 processes",
           "verdict"]


# ---------------------------------------------------------------- venvs


def venv_python(name: str | None, main_python: str) -> tuple[str, str | None]:
    """The python of the venv ``name`` (built or rebuilt when its constraints changed), and an error if it cannot
    be built."""
    if name is None:
        return main_python, None
    folder = os.path.join(ROOT, ".venv-libs", name)
    constraints = os.path.join(ROOT, "libraries", f"{name}.txt")
    digest = hashlib.sha256(b"".join(open(os.path.join(ROOT, f), "rb").read()
                                     for f in (constraints, "pyproject.toml"))).hexdigest()
    stamp = os.path.join(folder, ".installed")
    python = os.path.join(folder, "bin", "python")
    if os.path.exists(stamp) and open(stamp).read().strip() == digest:
        return python, None
    print(f"building {os.path.relpath(folder, ROOT)} from libraries/{name}.txt ...", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    steps = [[sys.executable if shutil.which("python3") is None else "python3", "-m", "venv", folder],
             [python, "-m", "pip", "install", "-q", TORCH],
             [python, "-m", "pip", "install", "-q", "-c", constraints, "-e", ROOT, *VENV_PACKAGES[name]]]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
            return python, f"venv build failed: {lines[-1] if lines else proc.returncode}"
    with open(stamp, "w") as f:
        f.write(digest + "\n")
    return python, None


# ---------------------------------------------------------------- runs


def env() -> dict:
    # PYTHONHASHSEED: GLiNER's collator shuffles list(set(entity types)), an order that depends on the string hash
    # seed; each run is its own process, so without one seed the two bases would see different batches
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "0",
            "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), HERE])}


def launch(python: str, module: str, out: str, cases: list[str], *flags: str, nproc: int = 1,
           timeout: int = 1800) -> str:
    """Run worker.py for ``cases``; returns its output's tail (the worker writes each case's result itself)."""
    cmd = [python, os.path.join(HERE, "worker.py"), module, out, *cases, *flags]
    if nproc > 1:
        cmd[1:1] = ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
    try:
        proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)
        return (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"


def load(out: str, case: str, name: str):
    import torch

    path = os.path.join(out, case, f"{name}.pt")
    if os.path.exists(path):
        return torch.load(path, weights_only=False), None
    err = os.path.join(out, case, f"{name}.err")
    if os.path.exists(err):
        lines = [line for line in open(err).read().splitlines() if line.strip()]
        return None, lines[-1][:300]
    return None, "no result (the process died or timed out)"


# ---------------------------------------------------------------- comparisons


def is_time(key: str) -> bool:
    """A timing (``train_runtime``, setfit's ``eval_embedding_steps_per_second``, ...): never compared."""
    return key in TIMES or key.endswith(("_runtime", "_per_second"))


def logged(run: dict, after: int = 0) -> dict:
    return {(s, k): v for s, k, v in run["logs"] if not is_time(k) and (s or 0) > after}


def diff_logs(a: dict, b: dict, after: int = 0, ignore: frozenset = frozenset()) -> dict:
    """Two runs' logged numbers compared: the largest |difference| of the training losses ("loss"), of the eval
    losses ("eval"), of every other number ("other", with "worst" naming it), "keys" (logged by one run only)."""
    x, y = logged(a, after), logged(b, after)
    common = [k for k in x.keys() & y.keys() if k[1] not in ignore]
    d = {k: abs(x[k] - y[k]) for k in common}
    is_loss = lambda k: "loss" in k[1]  # noqa: E731
    train = [d[k] for k in common if is_loss(k) and not k[1].startswith("eval_")]
    evals = [d[k] for k in common if is_loss(k) and k[1].startswith("eval_")]
    others = {k: d[k] for k in common if not is_loss(k)}
    worst = max(others, key=others.get) if others else None
    return {"loss": max(train, default=float("nan")), "eval": max(evals, default=None),
            "other": others[worst] if worst else 0.0,
            "worst": f"{worst[1]}@{worst[0]} {x[worst]:.6g} vs {y[worst]:.6g}" if worst and others[worst] else "",
            "differing": {k[1] for k in common if d[k] != 0},
            "keys": sorted({k[1] for k in set(x) ^ set(y)} - ignore)}


def as_logged_by(run: dict, hf: dict | None) -> dict:
    """``run`` (cadence's) with each step's ``loss`` as transformers 4.x logs it, rounded to 4 decimals, when ``hf``
    ran on 4.x (transformers 5 and cadence log it unrounded): compared so, the two logs are the same numbers."""
    if hf is None or not hf["versions"]["transformers"].startswith("4."):
        return run
    return {**run, "logs": [(s, k, round(v, 4) if k == "loss" else v) for s, k, v in run["logs"]]}


def diff_weights(a: dict, b: dict) -> float:
    if a["weights"].keys() != b["weights"].keys():
        return float("inf")
    return max(((a["weights"][n] - b["weights"][n]).abs().max().item() for n in a["weights"]), default=0.0)


def fmt(x) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.1e}")


def blank(library: str, trainer: str, case: str = "", start: str = "", verdict: str = "", **extra) -> dict:
    return {"library": library, "trainer": trainer, "case": case, "version": "", "transformers": "", "start": start,
            "dloss": None, "deval": None, "dw": None, "resume": "", "2 processes": "", "verdict": verdict, "notes": "",
            **extra}


def row(library: str, case: str, trainer: str, hf_out: str, cd_out: str, two: tuple | None, note: str,
        fixed_in_5: tuple[str, str] | None = None) -> dict:
    hf, hf_err = load(hf_out, case, "run")
    cd, cd_err = load(cd_out, case, "run")
    r = blank(library, trainer, case, **{"2 processes": "not run", "notes": note})
    for res in (cd, hf):
        if res:
            r["version"], r["transformers"] = res["versions"]["library"], res["versions"]["transformers"]
    if fixed_in_5 and hf is not None and hf["versions"]["transformers"].startswith("4."):
        # transformers 4.x gets this trainer's numbers wrong in a way 5.x fixed, and cadence computes as 5.x: the
        # reference is transformers 5's run of the same case (the main pins' rows: the same seed, data and model)
        why, main_hf_out = fixed_in_5
        main_hf, main_err = load(main_hf_out, case, "run")
        if main_hf is None:
            return {**r, "start": f"no transformers 5 run to compare with ({main_err}): run the main pins' row first",
                    "verdict": "DIFFERS"}
        off = max(diff_logs(hf, main_hf)["loss"], diff_weights(hf, main_hf))
        held = f"{why}: held to transformers {main_hf['versions']['transformers']}'s run (4.x against it: {fmt(off)})"
        note = "; ".join(filter(None, [note, held]))
        hf, hf_out = main_hf, main_hf_out
    if cd is None:
        r["start"] = f"fails: {cd_err}" + (f" (fails on transformers too: {hf_err})" if hf is None else "")
        r["verdict"] = "cannot run here" if hf is None else "DIFFERS"
        return r
    r["start"] = "ok"
    tol = TOL_BF16 if cd["bf16"] else TOL
    notes = [note]
    ok = True
    if hf is None:
        notes.append(f"transformers' run failed: {hf_err}")
        ok = False
    else:
        d = diff_logs(hf, as_logged_by(cd, hf))
        r["dloss"], r["deval"], r["dw"] = d["loss"], d["eval"], diff_weights(hf, cd)
        if as_logged_by(cd, hf) is not cd:
            notes.append("transformers 4.x logs each step's loss rounded to 4 decimals: cadence's compared so rounded")
        if d["keys"]:
            notes.append(f"logged by one side only: {d['keys']}")
        if d["worst"] and d["other"] > tol:
            notes.append(f"other logged numbers differ: {d['worst']}")
        ok = (d["loss"] <= tol and (d["eval"] or 0) <= tol and r["dw"] <= tol and d["other"] <= tol
              and not d["keys"])
    resumed, res_err = load(cd_out, case, "resumed")
    hf_resumed, _ = load(hf_out, case, "resumed")
    if resumed is None:
        r["resume"], ok = f"fails: {res_err}", False
    else:
        d, dw = diff_logs(cd, resumed, after=2), diff_weights(cd, resumed)
        same = d["loss"] == 0 and not d["eval"] and d["other"] == 0 and dw == 0 and not d["keys"]
        r["resume"] = "bit-identical" if same else (f"dloss {fmt(d['loss'])}, deval {fmt(d['eval'])}, dw {fmt(dw)}"
                                                     + (f", {d['worst']}" if d["worst"] else "")
                                                     + (f", keys {d['keys']}" if d["keys"] else ""))
        if not same and hf is not None and hf_resumed is not None:
            # transformers' resume of the same trainer: a library that keeps state outside the checkpoint (a
            # counter, a buffer) resumes off the unbroken run on either base; cadence must then resume as transformers
            # (train_loss aside: after a resume cadence averages it over the whole run, transformers over the resumed
            # steps, a deliberate difference the README lists)
            theirs = diff_logs(hf, hf_resumed, after=2, ignore=frozenset({"train_loss"}))
            mine = diff_logs(hf_resumed, as_logged_by(resumed, hf), after=2, ignore=frozenset({"train_loss"}))
            as_theirs = max(mine["loss"], mine["eval"] or 0, mine["other"], diff_weights(hf_resumed, resumed)) <= tol
            if theirs["differing"] and as_theirs and not mine["keys"]:
                notes.append(f"a resume differs on transformers too (the library's state outside the checkpoint: "
                             f"{sorted(theirs['differing'])[:4]}); cadence's resumed run equals transformers' resumed "
                             f"run")
                r["resume"] = f"as transformers ({r['resume']})"
                same = True
        ok = ok and same
    if two is not None:
        (h2, h2e), (c2, c2e) = load(two[0], case, "run"), load(two[1], case, "run")
        if c2 is None:
            r["2 processes"], ok = f"fails: {c2e}" + (" (transformers too)" if h2 is None else ""), False
        elif h2 is None:
            r["2 processes"] = f"transformers fails: {h2e}"
        else:
            reference, where = h2, ""
            if two[2] and hf is not None:  # transformers' own 2-process run is biased: one process is the reference
                biased = max(diff_logs(hf, h2)["loss"], diff_weights(hf, h2))
                notes.append(f"{two[2]} (transformers on 2 processes against 1: dloss,dw {fmt(biased)})")
                reference, where = hf, " against transformers on 1 process"
            d = diff_logs(reference, as_logged_by(c2, reference))
            worst = max(d["loss"], diff_weights(reference, c2))
            r["2 processes"] = f"dloss,dw {fmt(worst)}{where}"
            ok = ok and worst <= tol
    r["notes"] = "; ".join(filter(None, notes))
    r["verdict"] = "equal" if ok else "DIFFERS"
    return r


# ---------------------------------------------------------------- the matrix


def run_library(library: str, cases: list[str] | None, opts) -> list[dict]:
    module_name, venv = LIBRARIES[library]
    lib = importlib.import_module(f"lib_{module_name}")
    cases = cases or list(lib.CASES)
    notes = getattr(lib, "NOTES", {})
    out = os.path.join(opts.out, library)
    python, error = venv_python(venv, opts.python)
    rows = []
    if error is None:
        error = getattr(lib, "CANNOT_RUN", None)
    if error:
        return [blank(library, lib.CASES[c], c, error, "cannot run here") for c in cases]
    start = time.time()
    tails = {}
    for side, flags in (("hf", ["--resume"]), ("cadence", ["--cadence", "--resume"])):
        folder = os.path.join(out, side)
        done = lambda c: any(os.path.exists(os.path.join(folder, c, f"run.{e}")) for e in ("pt", "err"))  # noqa: E731
        if opts.reuse and all(done(c) for c in cases):
            tails[side] = "reused"
            continue
        tails[side] = launch(python, module_name, folder, cases, *flags)
    # a library again at transformers 4.x ("trl@4.57"): the cases 4.x computes wrongly are held to its main pins' rows
    main_library, at_4x = library.partition("@")[::2]
    fixed = getattr(lib, "TRANSFORMERS_4X", {}) if at_4x else {}
    two = None
    wanted = [c for c in cases if c in TWO_PROCESS_CASES.get(library, [])] if opts.two_processes else []
    two_done = lambda side: all(os.path.exists(os.path.join(out, side, c, "run.pt")) for c in wanted)  # noqa: E731
    if wanted and not (opts.reuse and two_done("hf2") and two_done("cadence2")):
        two_flags = ("--batch", "2", "--eval-batch", "4")
        launch(python, module_name, os.path.join(out, "hf2"), wanted, *two_flags, nproc=2)
        launch(python, module_name, os.path.join(out, "cadence2"), wanted, "--cadence", *two_flags, nproc=2)
    if wanted:  # a library whose 2-process runs transformers gets wrong says why: cadence's are held to 1 process
        two = (os.path.join(out, "hf2"), os.path.join(out, "cadence2"), getattr(lib, "TRANSFORMERS_TWO_PROCESSES", ""))
    for case in cases:
        rows.append(row(library, case, lib.CASES[case], os.path.join(out, "hf"), os.path.join(out, "cadence"),
                        two if case in wanted else None, notes.get(case, ""),
                        (fixed[case], os.path.join(opts.out, main_library, "hf")) if case in fixed else None))
    if opts.verbose:
        print(tails["cadence"])
    for trainer, reason in getattr(lib, "NOT_RUN", {}).items():
        rows.append(blank(library, trainer, "", reason, "cannot run here", version=rows[0]["version"],
                          transformers=rows[0]["transformers"]))
    if hasattr(lib, "trainers") and cases == list(lib.CASES):  # what the installed library ships and no row covers
        listed = subprocess.run([python, "-c", f"import json, lib_{module_name} as m; print(json.dumps(m.trainers()))"],
                                env=env(), capture_output=True, text=True)
        shipped = json.loads(listed.stdout.strip().splitlines()[-1]) if listed.returncode == 0 else []
        covered = set(lib.CASES.values()) | set(getattr(lib, "NOT_RUN", {}))
        for trainer in shipped:
            name, failed, why = trainer.partition(": import failed ")
            if failed:  # its module does not import with these pins (a transformers it needs): nothing to run
                rows.append(blank(library, name, "", f"does not import here: {why.strip('()')}", "cannot run here",
                                  version=rows[0]["version"], transformers=rows[0]["transformers"]))
            elif trainer not in covered:
                rows.append(blank(library, trainer, "", "not covered by the matrix yet", "NOT COVERED",
                                  version=rows[0]["version"], transformers=rows[0]["transformers"]))
    print(f"{library}: {len(cases)} trainers in {time.time() - start:.0f} s", flush=True)
    return rows


def table(rows: list[dict]) -> list[list[str]]:
    return [[str(r["library"]), str(r["version"]), str(r["transformers"]), str(r["trainer"]), str(r["start"]),
             fmt(r["dloss"]), fmt(r["deval"]), fmt(r["dw"]), str(r["resume"]), str(r["2 processes"]),
             str(r["verdict"])] for r in rows]


def public(cell: str) -> str:
    """A cell as the docs print it: without the paths of the machine that ran the matrix (a parenthesised absolute
    path is dropped), and gloo's "connection closed" (which names a source file, a port and a joke) said as what it
    means: another process of the run failed first."""
    cell = re.sub(r" ?\(/[^)]*\)?", "", cell)
    return re.sub(r"\[[^\]]*gloo[^\]]*\] Connection closed by peer.*",
                  "connection closed by peer (gloo): another process of the run failed first", cell)


def markdown(result: dict) -> str:
    lines = ["# Libraries on cadence: the tested matrix", "",
             "Generated by `scripts/libraries/run.py` (`make test-libraries`) from "
             f"`{os.path.basename(result['json'])}`; do not edit by hand. Run on {result['date']}, "
             f"{result['wall_s']:.0f} s wall" + (" (runs an earlier invocation left were reused: --reuse)"
                                                 if result.get("reused") else "") + f", torch {result['torch']}.", "",
             "Each trainer trains a tiny model (built locally, no download) 4 steps on transformers' Trainer and on "
             "cadence's (`cadence.patch_transformers()` before the library is imported), evaluating and saving at "
             "steps 2 and 4; cadence's run is then resumed from `checkpoint-2`. dloss: the largest difference of the "
             "logged training losses (every step's, train_loss, the library's own); deval: of the eval losses "
             "(the eval set is one batch); dw: of the final weights; "
             "resume: the resumed run against the unbroken one; 2 processes: cadence against transformers on 2 "
             "processes (torchrun). Equal means within 1e-5 (1e-3 for bf16 runs) and a bit-identical resume.", "",
             "| " + " | ".join(COLUMNS + ["notes"]) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for r, cells in zip(result["rows"], table(result["rows"])):
        lines.append("| " + " | ".join(public(c).replace("|", "\\|") for c in cells + [r.get("notes", "")]) + " |")
    return "\n".join(lines) + "\n"


def print_table(rows: list[dict]) -> None:
    cells = [COLUMNS] + [[c if len(c) <= 60 else c[:57] + "..." for c in line] for line in table(rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    for n, line in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=sys.executable, help="the python of the main pins (its venv has trl and "
                   "sentence-transformers)")
    p.add_argument("--only", action="append", default=[], help="LIBRARY or LIBRARY:case,case (repeatable)")
    p.add_argument("--fast", action="store_true", help="CI's slice: " + ", ".join(f"{k} {v}" for k, v in FAST.items()))
    p.add_argument("--two-processes", action="store_true", help="add the 2-process column (torchrun)")
    p.add_argument("--out", default=os.path.join(ROOT, ".venv-libs", "runs"), help="where the runs write")
    p.add_argument("--json", help="where the table goes as JSON (default: docs/libraries-matrix.json for the whole "
                   "matrix, OUT/matrix.json for a part)")
    p.add_argument("--markdown", help="where the table goes as markdown (default: docs/libraries-matrix.md for the "
                   "whole matrix, OUT/matrix.md for a part)")
    p.add_argument("--render", action="store_true", help="only write --markdown from --json")
    p.add_argument("--reuse", action="store_true", help="keep the 1-process results a previous run left in --out "
                   "for a library whose every case has one (after an interrupted matrix)")
    p.add_argument("--verbose", action="store_true")
    opts = p.parse_args(argv)
    whole = not (opts.only or opts.fast)  # only the whole matrix replaces the docs' table
    folder = os.path.join(ROOT, "docs") if whole or opts.render else opts.out
    opts.json = opts.json or os.path.join(folder, "libraries-matrix.json" if folder != opts.out else "matrix.json")
    opts.markdown = opts.markdown or os.path.join(folder, "libraries-matrix.md" if folder != opts.out else "matrix.md")
    if opts.render:
        result = json.load(open(opts.json))
        result["json"] = opts.json
        open(opts.markdown, "w").write(markdown(result))
        return 0
    selection: dict[str, list[str] | None] = {}
    for item in opts.only:
        name, _, cases = item.partition(":")
        selection[name] = cases.split(",") if cases else None
    if opts.fast:
        selection = dict(FAST)
    selection = selection or {name: None for name in LIBRARIES}
    start = time.time()
    rows = []
    for library, cases in selection.items():
        rows += run_library(library, cases, opts)
    import torch

    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.time() - start,
              "reused": opts.reuse,
              "torch": torch.__version__, "rows": rows, "json": opts.json}
    print_table(rows)
    print(f"wall time {result['wall_s']:.0f} s")
    os.makedirs(os.path.dirname(opts.json), exist_ok=True)
    with open(opts.json, "w") as f:
        json.dump({k: v for k, v in result.items() if k != "json"}, f, indent=1, default=str)
    with open(opts.markdown, "w") as f:
        f.write(markdown(result))
    bad = [r for r in rows if r["verdict"] in ("DIFFERS", "NOT COVERED")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

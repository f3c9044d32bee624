#!/usr/bin/env python3
"""Runs every documented `trident` command of README.md and docs/*.md, as written, and checks what the doc claims.

What it reads (the conventions the docs follow; docs/testing.md "Documented commands are tested" says the same):
  - A ```sh block is a list of shell commands run from the repository root. Each command (a line, or lines joined
    by a trailing backslash) that starts with `trident` runs with `trident` mapped to the built binary; one that
    starts with `mpirun` runs with `build/release/trident` mapped to it and the environment docs/mpi.md gives for a
    container or root (OMPI_ALLOW_RUN_AS_ROOT, oversubscription, shared memory); one that runs
    `python3 -m trident_golden` runs with a python3 that has h5py and numpy; a block without such a command is not
    run (e.g. ./scripts/setup).
  - A ```text block right after a ```sh block (blank lines between allowed) is the output the doc shows: the
    numbers in it must appear in the command's stdout+stderr, in the same order (lines may be left out). Wall-clock
    numbers (a number followed by `s`, `s/step`, `ms/step` or `%` of a progress bar) are not compared.
  - A marker on the line before a ```sh fence changes what happens to the block:
        <!-- doc-test: exit N -->          the block's commands exit with code N (default 0)
        <!-- doc-test: long -->            runs only with --long (which runs only these; ctest label `long`)
        <!-- doc-test: skip REASON -->     never run (needs a GPU, several nodes, ...); counted and printed
  - A marker line `<!-- doc-test: json-table -->` before a markdown table with columns `command`, `JSON key`
    and `--json value` checks each row: the value in the row equals the command's `--json` output at that key
    (a dotted path), rounded to the decimals the row shows.
  - `trident emulate --help`: the example mesh of --mesh ("e.g. d_rep=...") runs with every other flag at its
    default (one step).
Usage: doc_commands.py TRIDENT_BINARY REPO_ROOT [--long] [--only FILE]
Prints one line per block (file:line, exit code, seconds) and the counts; exit code 1 on any failure.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import time

MARKER = re.compile(r"^<!--\s*doc-test:\s*(\w[\w-]*)\s*(.*?)\s*-->\s*$")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
# Wall-clock numbers: not compared.
TIMING = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?\s*(?:s/step|ms/step|s\b|%)")


def numbers(text):
    """The numbers of `text` in order, wall-clock ones removed; commas in 1,024 are kept as written."""
    out = []
    for line in text.splitlines():
        line = TIMING.sub(" ", line)
        out.extend(m.group(0) for m in NUMBER.finditer(line))
    return out


def is_subsequence(want, got):
    it = iter(got)
    missing = []
    for w in want:
        for g in it:
            if g == w:
                break
        else:
            missing.append(w)
            break
    return missing


def blocks(path):
    """Yields dicts: kind ('sh', 'text', 'table'), line (1-based), body (list of lines), marker (name, arg)."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    marker = None
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line.strip())
        if m:
            marker = (m.group(1), m.group(2))
            i += 1
            continue
        if line.lstrip().startswith("```"):  # a fence, possibly indented inside a list item
            indent = len(line) - len(line.lstrip())
            lang = line.strip()[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                j += 1
            body = [l[indent:] if l[:indent].strip() == "" else l for l in lines[i + 1:j]]
            yield {"kind": lang or "plain", "line": i + 1, "body": body, "marker": marker}
            marker = None
            i = j + 1
            continue
        if marker and marker[0] == "json-table" and line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            yield {"kind": "table", "line": i + 1, "body": lines[i:j], "marker": marker}
            marker = None
            i = j
            continue
        if line.strip():
            marker = None  # a marker applies to the very next block
        i += 1


def commands(body):
    """The commands of an sh block (continuation lines joined), comments and blank lines dropped."""
    out, cur = [], ""
    for raw in body:
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        s = cur.strip()
        cur = ""
        if s and not s.startswith("#"):
            out.append(s)
    return out


# `python3 -m trident_golden ...` (with PYTHONPATH=... before it): the Python package's commands, run with a python3
# that has h5py and numpy (the first on PATH that does, else Debian's /usr/bin/python3: scripts/deps installs them).
PY_GOLDEN = re.compile(r"^(?:\w+=\S+\s+)*python3 -m trident_golden\b")


def golden_python():
    for cand in ("python3", "/usr/bin/python3"):
        try:
            if subprocess.run([cand, "-c", "import h5py, numpy"], capture_output=True).returncode == 0:
                return cand
        except OSError:
            pass
    return "python3"


def run(cmd, trident, root, timeout):
    """Runs one documented command with `trident` mapped to the binary; returns (rc, output, seconds)."""
    words = shlex.split(cmd, comments=True)
    shell_cmd = cmd
    env = dict(os.environ)
    if words and words[0] == "trident":
        shell_cmd = shlex.quote(trident) + cmd[len("trident"):]
    elif PY_GOLDEN.search(cmd):
        shell_cmd = cmd.replace("python3 -m trident_golden", shlex.quote(golden_python()) + " -m trident_golden", 1)
    elif words and words[0] == "mpirun":
        # As docs/mpi.md tells a user in a container or as root: no ssh agent, shared memory, root allowed, more
        # processes than cores allowed.
        shell_cmd = cmd.replace(" build/release/trident ", " " + shlex.quote(trident) + " ", 1)
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_plm_rsh_agent": "",
                    "OMPI_MCA_btl": "self,vader", "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    t0 = time.monotonic()
    try:
        p = subprocess.run(["bash", "-o", "pipefail", "-c", shell_cmd], cwd=root, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout, text=True, env=env)
        return p.returncode, p.stdout, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n[timed out after {timeout} s]", time.monotonic() - t0


def cell_number(cell):
    """'0.646 GB' -> (0.646, 3); '4,481' -> (4481.0, 0); None when the cell holds no number."""
    m = NUMBER.search(cell)
    if not m:
        return None
    s = m.group(0).replace(",", "")
    decimals = len(s.split(".")[1]) if "." in s else 0
    return float(s), decimals


def json_at(obj, path):
    for key in path.split("."):
        obj = obj[key]
    return obj


def check_table(block, trident, root, cache, where):
    rows = [r.strip().strip("|").split("|") for r in block["body"]]
    head = [c.strip() for c in rows[0]]
    try:
        ci, ki, vi = head.index("command"), head.index("JSON key"), head.index("--json value")
    except ValueError:
        return [f"{where}: a json-table needs the columns 'command', 'JSON key' and '--json value' (has {head})"], 0
    errors = []
    for r in rows[2:]:
        cells = [c.strip() for c in r]
        cmd, key, val = cells[ci].strip("`"), cells[ki].strip("`"), cells[vi]
        if not cmd.startswith("trident ") or "--json" not in cmd.split():
            errors.append(f"{where}: row '{'|'.join(cells)}': the command must be a `trident ... --json` command")
            continue
        if cmd not in cache:
            rc, out, _ = run(cmd + " 2>/dev/null", trident, root, 60)
            cache[cmd] = json.loads(out) if rc == 0 else None
            if rc != 0:
                errors.append(f"{where}: `{cmd}` exited {rc}")
        if cache[cmd] is None:
            continue
        want = cell_number(val)
        try:
            got = float(json_at(cache[cmd], key))
        except (KeyError, TypeError, ValueError):
            errors.append(f"{where}: `{cmd}` has no number at JSON key {key}")
            continue
        if want is None or round(got, want[1]) != round(want[0], want[1]):
            errors.append(f"{where}: {key} of `{cmd}`: the doc shows '{val}', --json gives {got!r}")
    return errors, len(rows) - 2


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    trident, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    run_long = "--long" in argv
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    files = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    if only:
        files = [f for f in files if f == only]
    ran = skipped = not_long = tables = 0
    failures = []
    cache = {}
    for f in files:
        bl = list(blocks(os.path.join(root, f)))
        for k, b in enumerate(bl):
            where = f"{f}:{b['line']}"
            if b["kind"] == "table":
                errs, n = check_table(b, trident, root, cache, where)
                failures += errs
                tables += 1
                print(f"[ table ] {where}: {n} --json values checked{'' if not errs else ', ' + str(len(errs)) + ' wrong'}")
                continue
            if b["kind"] != "sh":
                continue
            cmds = [c for c in commands(b["body"]) if c.split()[0] in ("trident", "mpirun") or PY_GOLDEN.search(c)]
            if not cmds:
                continue
            marker = b["marker"] or ("", "")
            if marker[0] == "skip":
                skipped += 1
                print(f"[ skip  ] {where}: {marker[1]}")
                continue
            if (marker[0] == "long") != run_long:  # --long runs the long blocks only
                not_long += 1
                print(f"[ {'long' if not run_long else 'fast'}  ] {where}: "
                      f"{'runs with --long (ctest -L long)' if not run_long else 'runs without --long'}")
                continue
            expect_rc = int(marker[1]) if marker[0] == "exit" else 0
            shown = None  # a ```text block right after
            if k + 1 < len(bl) and bl[k + 1]["kind"] == "text":
                f_lines = open(os.path.join(root, f), encoding="utf-8").read().split("\n")
                between = f_lines[b["line"] + len(b["body"]) + 1:bl[k + 1]["line"] - 1]
                if all(not s.strip() for s in between):
                    shown = "\n".join(bl[k + 1]["body"])
            out_all = ""
            t_all = 0.0
            for c in cmds:
                rc, out, t = run(c, trident, root, 900 if marker[0] == "long" else 120)
                out_all += out
                t_all += t
                if rc != expect_rc:
                    failures.append(f"{where}: `{c}` exited {rc}, the doc expects {expect_rc}; output:\n"
                                    + "\n".join("    " + l for l in out.splitlines()[-15:]))
            ran += 1
            checked = ""
            if shown is not None:
                want = numbers(shown)
                missing = is_subsequence(want, numbers(out_all))
                checked = f", {len(want)} numbers of the shown output"
                if missing:
                    failures.append(f"{where}: the shown output's number {missing[0]} is not in the output (in "
                                    f"order); output:\n" + "\n".join("    " + l for l in out_all.splitlines()[-25:]))
            print(f"[ run   ] {where}: {len(cmds)} command(s), exit {expect_rc}{checked} ({t_all:.1f} s)")
    if not run_long and not only:
        rc, out, _ = run("trident emulate --help", trident, root, 30)
        m = re.search(r"--mesh .*?e\.g\. (\S+?=\S+?)[ ,;)]*\(", out)
        if rc != 0 or not m:
            failures.append(f"emulate --help: exit {rc}, or no 'e.g. MESH' example for --mesh found in:\n{out}")
        else:
            cmd = f"trident emulate --mesh {m.group(1)} --steps 1"
            rc, out, t = run(cmd, trident, root, 120)
            ran += 1
            print(f"[ run   ] emulate --help example: `{cmd}`, exit {rc} ({t:.1f} s)")
            if rc != 0:
                failures.append(f"the --mesh example of `emulate --help` fails with the defaults: `{cmd}`:\n{out}")
    print(f"doc commands: {ran} block(s) run, {tables} json table(s) checked, {skipped} skipped (marked skip), "
          f"{not_long} left for the {'fast' if run_long else '--long'} run; {len(failures)} failure(s)")
    for e in failures:
        print("FAIL " + e)
    if ran + tables == 0:
        print("FAIL no documented command found")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

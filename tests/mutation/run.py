"""Mutation testing of the pure core: mutmut on the core modules, against the core and
golden tests, with one worker (the machines are small and shared).

    make mutation                          # every module of interlock.core
    make mutation MODULES="state engine"   # some of them
    .venv/bin/python tests/mutation/run.py --score-only   # the last run's scores again

mutmut mutates code under ``./``, ``src/`` or ``source/`` only, so the run happens in a
staged copy of the tree under ``.mutation/run/`` (``src/interlock`` is the package, the
rest is what the tests read). All the chosen modules go through one mutmut run, so its
stats and clean runs of the test selection are paid once. It prints each module's score,
and ``.mutation/scores.json`` keeps the last score of every module and its surviving
mutants (mutmut's own output is in ``.mutation/run/mutmut.log``; ``--score-only`` reads the
scores of a run still going, too). To see a survivor:
``cd .mutation/run && ../../.venv/bin/mutmut show <name>``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "orchestrator" / "interlock" / "core"
WORK = ROOT / ".mutation"
TESTS = ["tests/core", "tests/golden"]
# Every core test compiles a manifest, so a surviving mutant of lowering or of the YAML
# loader would run nearly the whole suite. These files compile manifests and check what
# comes out (the definition, pinned whole; each problem's rule, message and position; the
# loader's limits): they reach the same lines and branches of these modules as the whole
# selection, in about a fifth of the time.
COMPILING = [
    "tests/core/test_compile_entry_points.py",
    "tests/core/test_dag.py",
    "tests/core/test_dag_outcomes.py",
    "tests/core/test_edge_budgets.py",
    "tests/core/test_inputs_triggers.py",
    "tests/core/test_language_doc.py",
    "tests/core/test_lowering_checks.py",
    "tests/core/test_lowering_pinned.py",
    "tests/core/test_outcomes.py",
    "tests/core/test_quorum.py",
    "tests/core/test_required_steps.py",
    "tests/core/test_retry_errors.py",
    "tests/core/test_source.py",
    "tests/core/test_source_limits.py",
    "tests/core/test_spawn_budgets.py",
    "tests/core/test_state_gate.py",
    "tests/core/test_structure.py",
    "tests/core/test_validator.py",
    "tests/core/test_workflow_rules.py",
]
SELECTIONS = {
    # Nearly every core test compiles or evaluates CEL, so each mutant of `Expression`
    # would run most of the suite. These files reach every line of cel.py the whole
    # selection reaches (coverage of cel.py is the same), in a tenth of the time.
    "cel": [
        "tests/core/test_cel_eval.py",
        "tests/core/test_cel_fast.py",
        "tests/core/test_cost_budget.py",
        "tests/core/test_expr_fast_path.py",
        "tests/core/test_expr_reads.py",
        "tests/core/test_expr_values.py",
        "tests/core/test_validator.py",
    ],
    **{m: list(COMPILING) for m in ("lowering", "lowering_dag", "lowering_scope")},
    **{m: list(COMPILING) for m in ("lowering_states", "source")},
    # The structural check runs on every manifest compiled, so a surviving mutant of it ran
    # every core test. The compiling tests reach the same lines and branches of it.
    "structure": list(COMPILING),
    # Every run started folds its spawn budgets, so each mutant of `spawn_budget` or
    # `SpawnProgress.of` would run the whole suite. These files reach every line and branch
    # of spawn.py (the whole selection reaches no more).
    "spawn": [
        "tests/core/test_redrive_steps.py",
        "tests/core/test_spawn_budgets.py",
    ],
    # Every test folds records, so each surviving mutant of `evolve`'s handlers would run
    # the whole selection (over four minutes on a loaded machine). These files fold every
    # kind of record, child runs, spawn and edge budgets, gates, quorums and the golden
    # logs: they reach the same lines and branches of state.py as the whole selection
    # (coverage: all but one line and the same four branch parts), in a seventh of the time.
    "state": [
        "tests/core/test_control_flow.py",
        "tests/core/test_cost_budget.py",
        "tests/core/test_dag.py",
        "tests/core/test_edge_budgets.py",
        "tests/core/test_engine.py",
        "tests/core/test_engine_edges.py",
        "tests/core/test_engine_inputs.py",
        "tests/core/test_engine_records.py",
        "tests/core/test_fold_records.py",
        "tests/core/test_quorum.py",
        "tests/core/test_reaction_records.py",
        "tests/core/test_spawn_budgets.py",
        "tests/core/test_state_gate.py",
        "tests/core/test_step_records.py",
        "tests/golden/test_golden_logs.py",
    ],
}
"""Modules measured against fewer tests than ``TESTS``: used when every module of a run
has one (run such a module on its own)."""
READ_BY_TESTS = ["contracts", "docs", "examples", "agents", "orchestrator"]
KILLED = {1, 3}
"""mutmut's exit codes of a killed mutant (a failing test; pytest's internal error)."""
TIMEOUT = {36, -24, 24, 152, 255}
"""A mutant whose tests ran out of time (an endless loop): detected, so counted as killed."""


def modules() -> list[str]:
    """Every module of the core, dotted below it (``state``, ``engine.step`` in a package);
    a package's ``__init__`` counts as a module only when it is more than re-exports."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        if path.name == "__init__.py" and (path.parent == CORE or "def " not in path.read_text()):
            continue
        relative = path.relative_to(CORE).with_suffix("")
        found.append(".".join(relative.parts))
    return found


def expand(names: list[str]) -> list[str]:
    """Module names as given, a package standing for all its modules (``engine``)."""
    known = modules()
    chosen = []
    for name in names:
        inside = [m for m in known if m.startswith(name + ".")]
        chosen.extend([name] if name in known else inside or [name])
    return chosen


def source_of(module: str) -> str:
    """The path mutmut mutates for a dotted core module, relative to the staged tree."""
    return "src/interlock/core/" + module.replace(".", "/") + ".py"


def selection(chosen: list[str]) -> list[str]:
    """The tests a run's mutants are measured against."""
    if chosen and all(module in SELECTIONS for module in chosen):
        return sorted({test for module in chosen for test in SELECTIONS[module]})
    return TESTS


def stage(chosen: list[str]) -> Path:
    """A fresh copy of what the tests need, laid out as mutmut expects."""
    here = WORK / "run"
    if here.exists():
        shutil.rmtree(here)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "orchestrator" / "interlock", here / "src" / "interlock", ignore=ignore)
    for name in [*TESTS, *READ_BY_TESTS]:
        shutil.copytree(ROOT / name, here / name, ignore=ignore)
    shutil.copy2(ROOT / "tests" / "conftest.py", here / "tests" / "conftest.py")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pytest_options = project["tool"]["pytest"]["ini_options"]
    lines = ["[tool.pytest.ini_options]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in pytest_options.items()]
    lines += [
        "",
        "[tool.mutmut]",
        'source_paths = ["src"]',
        f"only_mutate = {json.dumps([source_of(module) for module in chosen])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(selection(chosen))}",
        f"also_copy = {json.dumps(READ_BY_TESTS)}",
        # The ordinary suite does not use these; mutants run with -p no:... to stay quiet.
        'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider", "-x"]',
        "",
    ]
    (here / "pyproject.toml").write_text("\n".join(lines))
    return here


def score(here: Path, module: str) -> dict[str, object]:
    meta = here / "mutants" / (source_of(module) + ".meta")
    codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    outcome: Counter[str] = Counter()
    survivors = []
    for name, code in sorted(codes.items()):
        if code in KILLED or code in TIMEOUT:
            outcome["killed"] += 1
        elif code == 0:
            outcome["survived"] += 1
            survivors.append(name)
        else:
            outcome[f"exit {code}"] += 1
            survivors.append(name)
    total = sum(outcome.values())
    return {
        "mutants": total,
        "killed": outcome["killed"],
        "score": round(100 * outcome["killed"] / total, 1) if total else None,
        "outcomes": dict(outcome),
        "survivors": survivors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="core modules (default: all)")
    parser.add_argument("--min-score", type=float, default=90.0)
    parser.add_argument(
        "--score-only",
        action="store_true",
        help="only read the scores of the last run (finished or not) again",
    )
    args = parser.parse_args(argv)
    chosen = expand(args.modules) if args.modules else modules()
    unknown = sorted(set(chosen) - set(modules()))
    if unknown:
        parser.error(f"not core modules: {', '.join(unknown)} (known: {', '.join(modules())})")
    WORK.mkdir(exist_ok=True)
    here = WORK / "run"
    if not args.score_only:
        # One mutmut run for all the modules: its stats and clean runs of the whole test
        # selection, which take minutes, are paid once.
        stage(chosen)
        print(f"== mutmut on {', '.join(chosen)} in {here.relative_to(ROOT)}", flush=True)
        print(f"   against {' '.join(selection(chosen))}", flush=True)
        with (here / "mutmut.log").open("w") as log:
            done = subprocess.run(
                [str(Path(sys.executable).with_name("mutmut")), "run", "--max-children", "1"],
                cwd=here,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        # mutmut stops with an error when it made no mutant at all (modules of enums and
        # constants, which it leaves alone): then there is nothing to score.
        if done.returncode != 0 and any(score(here, m)["mutants"] for m in chosen):
            print((here / "mutmut.log").read_text()[-3000:])
            return done.returncode
    scores_file = WORK / "scores.json"
    scores = json.loads(scores_file.read_text()) if scores_file.exists() else {}
    low = []
    print("\nmodule               mutants  killed  score   survivors")
    for module in chosen:
        r = score(here, module)
        scores[module] = r
        shown = f"{r['score']}%" if r["mutants"] else "no mutants"
        pending = r["outcomes"].get("exit None", 0)  # type: ignore[attr-defined]
        note = f" ({pending} not run yet)" if pending else ""
        print(
            f"{module:<20} {r['mutants']:>7} {r['killed']:>7}  {shown:<7} "
            f"{len(r['survivors'])}{note}"  # type: ignore[arg-type]
        )
        if r["score"] is not None and r["score"] < args.min_score:  # type: ignore[operator]
            low.append(module)
    scores_file.write_text(json.dumps(scores, indent=2, sort_keys=True) + "\n")
    if low:
        print(f"below {args.min_score}%: {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

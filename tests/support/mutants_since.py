"""The mutant-name patterns for the modules a stop added or changed: ``make mutate-changed SINCE=<commit>``.

Reads the files changed since a commit (``git diff --name-only SINCE``, the working tree included), keeps the Python
modules that ``[tool.mutmut] only_mutate`` lists (and ``do_not_mutate`` does not), and prints one mutmut name glob per
module (``playground.engine.samplers.top_k.*``), space-separated, for ``make mutate MUTANTS=...``.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path


def mutant_patterns(changed: Iterable[str], only_mutate: list[str], do_not_mutate: Iterable[str] = ()) -> list[str]:
    """One mutmut name glob per changed module that the configuration mutates, in path order."""
    patterns = []
    for path in sorted(set(changed)):
        if not path.endswith(".py"):
            continue
        mutated = any(fnmatch.fnmatch(path, p) for p in only_mutate)
        if not mutated or any(fnmatch.fnmatch(path, p) for p in do_not_mutate):
            continue
        module = path.removesuffix(".py").replace("/", ".")
        if module.endswith(".__init__"):
            # mutmut drops "__init__." from the names of a package's own mutants: "pkg.x_f__mutmut_1",
            # "pkg.xǁClassǁmethod__mutmut_1" (a bare "pkg.x*" would also take its module "pkg.xtc").
            package = module.removesuffix(".__init__")
            patterns += [f"{package}.x_*", f"{package}.x\u01c1*"]
        else:
            patterns.append(f"{module}.*")
    return patterns


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: mutants_since.py COMMIT", file=sys.stderr)
        return 2
    try:
        from tomllib import loads
    except ModuleNotFoundError:  # Python 3.10: mutmut's own TOML reader there
        from toml import loads
    config = loads(Path("pyproject.toml").read_text())["tool"]["mutmut"]
    diff = subprocess.run(["git", "diff", "--name-only", "--diff-filter=d", argv[0], "--"], check=True,
                          capture_output=True, text=True).stdout.split()
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], check=True,
                               capture_output=True, text=True).stdout.split()
    existing = [p for p in diff + untracked if Path(p).is_file()]
    print(" ".join(mutant_patterns(existing, config.get("only_mutate", []), config.get("do_not_mutate", []))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

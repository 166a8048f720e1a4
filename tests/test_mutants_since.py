"""`make mutate-changed`: the changed modules that only_mutate lists become mutmut name globs, nothing else."""

from __future__ import annotations

import fnmatch

from support.mutants_since import mutant_patterns


def test_only_the_listed_python_modules_become_patterns_and_a_package_init_does_not_take_its_modules():
    changed = ["playground/engine/samplers/top_k.py", "playground/engine/samplers/__init__.py", "README.md",
               "playground/ui/window.py", "playground/state/what_if/bounds.py", "playground/engine/samplers/xtc.py"]
    patterns = mutant_patterns(changed, ["playground/engine/samplers/*.py", "playground/state/*.py"],
                               ["playground/engine/samplers/xtc.py"])
    assert patterns == ["playground.engine.samplers.x_*", "playground.engine.samplers.x\u01c1*",
                        "playground.engine.samplers.top_k.*", "playground.state.what_if.bounds.*"]
    # mutmut's names: a package's own mutants drop "__init__."; its modules' mutants keep their module's name.
    init_names = ["playground.engine.samplers.x_build__mutmut_1",
                  "playground.engine.samplers.x\u01c1Chain\u01c1apply__mutmut_2"]
    module_names = ["playground.engine.samplers.xtc.x_keep__mutmut_1",
                    "playground.engine.samplers.top_k.x_keep__mutmut_3"]
    init = patterns[:2]
    assert all(any(fnmatch.fnmatch(n, p) for p in init) for n in init_names)
    assert not any(fnmatch.fnmatch(n, p) for n in module_names for p in init)

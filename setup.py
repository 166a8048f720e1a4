"""The wheel carries the shipped files: ``resources/`` (presets, calibration texts, steering sets, the icon; the
README's screenshots stay out) is copied into the built package as ``playground/resources/``, where
``playground.resources.resources_dir`` finds it in an installed copy. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = ("calibration", "presets", "steering", "icons")  # as playground/resources.py lists them


class BuildWithResources(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads resources/ from the checkout itself
            return
        for name in SHIPPED:
            target = Path(self.build_lib) / "playground" / "resources" / name
            shutil.copytree(HERE / "resources" / name, target, dirs_exist_ok=True)

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            for name in SHIPPED:
                outputs += [str(Path(self.build_lib) / "playground" / "resources" / p.relative_to(HERE / "resources"))
                            for p in (HERE / "resources" / name).rglob("*") if p.is_file()]
        return outputs


setup(cmdclass={"build_py": BuildWithResources})

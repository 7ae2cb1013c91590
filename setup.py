"""Ships conf/flink-memory.yaml (the source of truth, at top level for users) as package data.

The build copies it into the wheel as `flink_memory/conf/flink-memory.yaml`, where `flink_memory.config`
finds it with importlib.resources; a checkout (or editable install) reads `conf/` directly. One file,
copied at build time, so the installed defaults cannot drift from the checkout's.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONF = Path("conf") / "flink-memory.yaml"
PACKAGED = Path("flink_memory") / "conf" / "flink-memory.yaml"


class BuildWithConf(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / PACKAGED
        self.mkpath(str(target.parent))
        self.copy_file(str(CONF), str(target), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PACKAGED)]


setup(cmdclass={"build_py": BuildWithConf})

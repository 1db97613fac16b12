"""The `kareus` command of an installed package (pyproject.toml): runs the CLI binary shipped in
the package (kareus/bin), which a console script cannot be itself."""

import os
import sys

from ._core import cli_path  # type: ignore[attr-defined]


def main() -> None:
    if not cli_path:
        sys.exit("kareus: the CLI binary is missing from this installation (kareus/bin/kareus)")
    os.execv(cli_path, [cli_path] + sys.argv[1:])

"""Type stubs of the native module (use the functions of `mmq` instead)."""

from collections.abc import Callable, Iterator, Sequence
from os import PathLike

__version__: str

class MmqError(Exception):
    """An mmq error; its message is the rendered diagnostic (what went wrong and where)."""

class Model:
    @property
    def inputs(self) -> list[str]: ...
    @property
    def outputs(self) -> list[str]: ...
    def inspect(self, format: str = "text") -> str: ...

def compile(
    inputs: Sequence[str | PathLike[str]],
    output: str | PathLike[str],
    options_json: str,
    samples: Iterator[Sequence[tuple[str, bytes]]] | None = None,
    progress: Callable[[str, int | None], object] | None = None,
) -> tuple[str, str]: ...
def load(paths: Sequence[str | PathLike[str]]) -> Model: ...
def run(model: Model, inputs: Sequence[tuple[str, bytes]]) -> list[tuple[str, list[bytes], bool]]: ...
def cli_main(args: Sequence[str]) -> int: ...

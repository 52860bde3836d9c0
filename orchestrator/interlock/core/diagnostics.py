"""Diagnostics: one error, where it is, and the rule it breaks."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.core.vocabulary import InterlockError


@dataclass(frozen=True, slots=True, order=True)
class Diagnostic:
    """One problem in a manifest, printed as ``path:line:col: rule-id: message``."""

    path: str
    line: int
    col: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule}: {self.message}"


class ManifestError(InterlockError):
    """Raised when manifests do not compile; carries every diagnostic found."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = sorted(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))

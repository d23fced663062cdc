"""Bad input handling: a clear error naming file and line, or, under --lenient, a count."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Longest message a TraceError carries (issue 17: a 100 KB type value printed 100 KB).
MAX_MESSAGE_CHARS = 300


class TraceError(Exception):
    """A problem in a source trace, located by file label and 1-based line number."""

    def __init__(self, file: str, line: int, category: str, message: str) -> None:
        self.file = file
        self.line = line
        self.category = category
        if len(message) > MAX_MESSAGE_CHARS:  # one line, whatever the input quoted into it
            message = message[:MAX_MESSAGE_CHARS] + "..."
        message = message.replace("\n", " ").replace("\r", " ")
        self.message = message
        where = f"{file}:{line}" if line > 0 else file
        super().__init__(f"{where}: {message} [{category}]")


@dataclass
class Problems:
    """Collects problems: raises at the first one in strict mode, counts them when lenient."""

    lenient: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    where: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def report(self, file: str, line: int, category: str, message: str) -> None:
        """Raise a TraceError, or (lenient) record that the offending input was skipped."""
        if not self.lenient:
            hint = " (without --strict it is skipped and counted)"
            raise TraceError(file, line, category, message + hint)
        self.counts[category] = self.counts.get(category, 0) + 1
        self.where.append(f"{file}:{line}" if line > 0 else file)
        self.messages.append(f"{self.where[-1]}: {message} [{category}]")

"""Read the repository's Dockerfile and .dockerignore the way Docker does, for the parts the tests need.

There is no container engine here, so the tests run the image's commands against the venv; they take those
commands from the Dockerfile itself, so a change to the Dockerfile changes what is tested.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_HEREDOC_START = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_GLOB_TOKEN = re.compile(r"\*\*/?|\*|\?|[^*?]+")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ENV, …
    arguments: str  # the rest of the instruction, continuation lines joined
    heredocs: tuple[str, ...]  # bodies of `<<EOF` documents, in order
    line: int  # 1-based line of the keyword, for messages


class Dockerfile:
    def __init__(self, path: Path):
        self.path = path
        self.instructions = list(_parse(path.read_text(encoding="utf-8").splitlines()))

    def exec_form(self, keyword: str) -> list[str]:
        """The last ENTRYPOINT or CMD as its argv; the shell form (no JSON array) is an error."""
        found = [instruction for instruction in self.instructions if instruction.keyword == keyword]
        if not found:
            raise LookupError(f"{self.path}: no {keyword} instruction")
        instruction = found[-1]
        try:
            argv = json.loads(instruction.arguments)
        except json.JSONDecodeError:
            argv = None
        if not isinstance(argv, list) or not all(isinstance(item, str) for item in argv):
            raise ValueError(f"{self.path}:{instruction.line}: {keyword} is not in exec form (a JSON array of strings)")
        return argv

    def env(self) -> dict[str, str]:
        """Variables set by ENV instructions, values as written (`$VAR` references are not expanded)."""
        variables: dict[str, str] = {}
        for instruction in self.instructions:
            if instruction.keyword != "ENV":
                continue
            for assignment in shlex.split(instruction.arguments):
                name, separator, value = assignment.partition("=")
                if not separator:
                    raise ValueError(f"{self.path}:{instruction.line}: ENV {assignment!r} is not NAME=value")
                variables[name] = value
        return variables

    def heredoc_file(self, destination: str) -> str:
        """The content a `COPY <<EOF <destination>` instruction writes."""
        for instruction in self.instructions:
            if instruction.keyword != "COPY" or not instruction.heredocs:
                continue
            if shlex.split(instruction.arguments)[-1] == destination:
                return instruction.heredocs[0]
        raise LookupError(f"{self.path}: no COPY of a here-document to {destination}")

    def copied_sources(self) -> list[str]:
        """Build-context paths that COPY instructions read (not here-documents, not other stages)."""
        sources: list[str] = []
        for instruction in self.instructions:
            if instruction.keyword != "COPY" or instruction.heredocs:
                continue
            words = shlex.split(instruction.arguments)
            if any(word.startswith("--from") for word in words):
                continue
            paths = [word for word in words if not word.startswith("--")]
            sources.extend(paths[:-1])
        return sources

    def user(self) -> str:
        users = [instruction.arguments.strip() for instruction in self.instructions if instruction.keyword == "USER"]
        if not users:
            raise LookupError(f"{self.path}: no USER instruction (the image would run as root)")
        return users[-1]

    def base_image(self) -> str:
        bases = [instruction.arguments.split()[0] for instruction in self.instructions if instruction.keyword == "FROM"]
        if not bases:
            raise LookupError(f"{self.path}: no FROM instruction")
        return bases[-1]


def _parse(lines: list[str]) -> Iterator[Instruction]:
    index = 0
    while index < len(lines):
        start = index
        text = lines[index].strip()
        index += 1
        if not text or text.startswith("#"):
            continue
        # Continuation lines end with a backslash; comment lines inside an instruction are dropped, as Docker does.
        while text.endswith("\\") and index < len(lines):
            text = text[:-1].rstrip()
            following = lines[index].strip()
            index += 1
            if following.startswith("#"):
                text += " \\"
                continue
            text += " " + following
        keyword, _, arguments = text.partition(" ")
        heredocs = []
        for strip_tabs, _quote, delimiter in _HEREDOC_START.findall(arguments):
            body = []
            while index < len(lines) and (lines[index].lstrip("\t") if strip_tabs else lines[index]) != delimiter:
                body.append(lines[index].lstrip("\t") if strip_tabs else lines[index])
                index += 1
            if index == len(lines):
                raise ValueError(f"line {start + 1}: here-document {delimiter} is not terminated")
            index += 1
            heredocs.append("\n".join(body) + "\n")
        yield Instruction(keyword.upper(), arguments.strip(), tuple(heredocs), start + 1)


class DockerIgnore:
    """`.dockerignore` patterns: Go filepath.Match syntax plus `**`, `!` re-includes, the last match wins, and a
    pattern that matches a directory excludes everything below it."""

    def __init__(self, path: Path):
        self._patterns: list[tuple[bool, re.Pattern[str], str]] = []
        for raw in path.read_text(encoding="utf-8").splitlines():
            pattern = raw.strip()
            if not pattern or pattern.startswith("#"):
                continue
            include = pattern.startswith("!")
            pattern = os.path.normpath(pattern.lstrip("!").strip()).lstrip("/")
            literal_prefix = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
            self._patterns.append((include, re.compile(_glob_to_regex(pattern)), literal_prefix))

    def excluded(self, relative_path: str) -> bool:
        candidates = _self_and_parents(relative_path)
        excluded = False
        for include, regex, _prefix in self._patterns:
            if any(regex.fullmatch(candidate) for candidate in candidates):
                excluded = not include
        return excluded

    def may_reinclude_below(self, directory: str) -> bool:
        """Whether some `!` pattern could match a path inside `directory` (else an excluded directory is skipped)."""
        inside = directory + "/"
        return any(include and (prefix.startswith(inside) or inside.startswith(prefix))
                   for include, _regex, prefix in self._patterns)

    def context_files(self, root: Path) -> list[str]:
        """Relative paths of the files `docker build root` sends to the builder."""
        files: list[str] = []
        for directory, subdirectories, names in os.walk(root):
            relative_directory = os.path.relpath(directory, root)
            relative_directory = "" if relative_directory == "." else relative_directory
            subdirectories[:] = [
                name for name in subdirectories
                if not self.excluded(_join(relative_directory, name))
                or self.may_reinclude_below(_join(relative_directory, name))
            ]
            files.extend(_join(relative_directory, name) for name in names
                         if not self.excluded(_join(relative_directory, name)))
        return sorted(files)


def _glob_to_regex(pattern: str) -> str:
    regex = ""
    for token in _GLOB_TOKEN.findall(pattern):
        if token == "**/":
            regex += "(?:.*/)?"
        elif token == "**":
            regex += ".*"
        elif token == "*":
            regex += "[^/]*"
        elif token == "?":
            regex += "[^/]"
        else:
            regex += re.escape(token)
    return regex


def _self_and_parents(relative_path: str) -> list[str]:
    parts = relative_path.split("/")
    return ["/".join(parts[:end]) for end in range(len(parts), 0, -1)]


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name

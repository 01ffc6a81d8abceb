"""The commands of helm-values/README.md, read so the tests can check them against the values and the image."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

_CODE_BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class InstallGuide:
    commands: tuple[tuple[str, ...], ...]  # each command as argv, from the shell code blocks, in order

    @classmethod
    def read(cls, path: Path) -> InstallGuide:
        commands = []
        for block in _CODE_BLOCK.findall(path.read_text(encoding="utf-8")):
            text = re.sub(r"\\\n", " ", block)
            for line in text.splitlines():
                argv = shlex.split(line, comments=True)
                if argv:
                    commands.append(tuple(argv))
        return cls(tuple(commands))

    def created(self, kind: str, name: str) -> tuple[str, ...]:
        """The `kubectl … create <kind> [generic] <name> …` command; it missing is an error naming it."""
        for argv in self.commands:
            if argv[0] != "kubectl" or "create" not in argv:
                continue
            words = [word for word in argv[argv.index("create") + 1:] if word != "generic"]
            if words[:2] == [kind, name]:
                return argv
        raise LookupError(f"the install guide never creates {kind} {name}")

    def secret_keys(self, name: str) -> dict[str, str]:
        """Keys of a Secret made with `--from-literal=KEY=value`, with their placeholder values."""
        literals = [word.removeprefix("--from-literal=") for word in self.created("secret", name)
                    if word.startswith("--from-literal=")]
        return dict(literal.split("=", 1) for literal in literals)

    def configmap_files(self, name: str) -> dict[str, str]:
        """Keys of a ConfigMap made with `--from-file=key=path`, with the file each comes from."""
        sources = [word.removeprefix("--from-file=") for word in self.created("configmap", name)
                   if word.startswith("--from-file=")]
        return dict(source.split("=", 1) for source in sources)

    def helm_install(self) -> tuple[str, ...]:
        installs = [argv for argv in self.commands if argv[:2] == ("helm", "install")]
        if len(installs) != 1:
            raise LookupError(f"expected one `helm install` command, found {len(installs)}")
        return installs[0]

    @staticmethod
    def option(argv: tuple[str, ...], name: str) -> str:
        """The value of `--name value` or `--name=value` in a command."""
        for index, word in enumerate(argv):
            if word == name and index + 1 < len(argv):
                return argv[index + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        raise LookupError(f"{' '.join(argv[:3])}: no {name} option")

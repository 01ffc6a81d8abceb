"""The docs and the code's docstrings and comments name only what exists.

Read: README.md, every page under docs/, benchmarks/README.md, and every Python file of the package, the tests, the
benchmarks, the scripts and the docs' hooks. A problem is:
- a dotted name `kafscale_lakehouse.x.y` (or `kafscale_lakehouse_tests.…`) whose module is not in the repository, or
  whose attribute the module does not define at its top level (or, for `Module.Class.attr`, in the class body);
- a code span naming a function or class of the package through a module (`appends.commit_append`,
  `engine.spark.table_source.read_table`) whose module does not define it, or through a module that does not exist
  (`table_offsets.commit_append`);
- a path such as `engine/tables/appends.py` or `helm-values/manifests/` that starts like a path of the repository
  (its first folder is a top-level entry or a folder of the package) yet is no file or folder of it, nor the end of
  one; a markdown file name (`DESIGN.md`) no file of the repository has;
- `kafscale-lakehouse <command> [<subcommand>] [--option]` in code spans and code blocks that the CLI's own parser
  (`apps/cli.py`, `_build_parser`) does not have;
- a config key: in the YAML blocks of the docs (those with a top-level key the config has), every key must be one of
  the config models' under one section; a code span such as `processor.max_bytes_per_run` or
  `mappings[].lfs.mode` must be a key of the models;
- an issue number (`issue 22`): the docs say what the code does, not how it came about.
The config keys are those the docs' configuration reference is generated from (docs/hooks/config_reference.py).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import os
import re
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kafscale_lakehouse.apps import cli

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = frozenset({".git", ".venv", "var", "site", "build", "spark-warehouse", "node_modules", "__pycache__",
                          ".dagster_home", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"})
PACKAGES = ("kafscale_lakehouse", "kafscale_lakehouse_tests")
PATH_EXTENSIONS = ("py", "md", "yaml", "yml", "sh", "c", "toml", "json", "png", "cfg", "txt")


def _load_config_reference():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "docs" / "hooks" / "config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


config_reference = _load_config_reference()


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}"


# ---- the repository as it is ----

@functools.cache
def repository_paths() -> tuple[frozenset[str], frozenset[str]]:
    """(files, folders) of the repository, relative to its root, without the ignored folders."""
    files, folders = set(), set()
    for directory, subdirectories, names in os.walk(ROOT):
        subdirectories[:] = [name for name in subdirectories
                             if name not in SKIPPED_DIRS and not name.endswith(".egg-info")]
        relative = Path(directory).relative_to(ROOT)
        folders |= {(relative / name).as_posix() for name in subdirectories}
        files |= {(relative / name).as_posix() for name in names}
    return frozenset(files), frozenset(folders)


@functools.cache
def path_suffixes() -> frozenset[str]:
    """Every file and folder of the repository, and every end of one after a `/` (`tables/appends.py`)."""
    files, folders = repository_paths()
    suffixes = set()
    for entry in files | folders:
        parts = entry.split("/")
        suffixes |= {"/".join(parts[index:]) for index in range(len(parts))}
    return frozenset(suffixes)


@functools.cache
def path_roots() -> frozenset[str]:
    """Names a path of ours may start with: the top-level entries and every folder name inside the packages."""
    files, folders = repository_paths()
    roots = {entry.split("/", 1)[0] for entry in files | folders}
    roots |= {Path(folder).name for folder in folders if folder.startswith(PACKAGES)}
    return frozenset(roots)


@functools.cache
def file_names() -> frozenset[str]:
    files, _ = repository_paths()
    return frozenset(Path(file).name for file in files)


def path_exists(path: str) -> bool:
    return path.rstrip("/") in path_suffixes()


@functools.cache
def syntax_tree(module_file: Path) -> ast.Module:
    return ast.parse(module_file.read_text())


@functools.cache
def module_names(module_file: Path) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The top-level names of a module and, per class, the names its body defines."""
    tree = syntax_tree(module_file)
    names: set[str] = set()
    classes: dict[str, frozenset[str]] = {}
    for node in tree.body:
        names |= _defined(node)
        if isinstance(node, ast.ClassDef):
            classes[node.name] = frozenset(name for item in node.body for name in _defined(item))
        if isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` imports, `try: import … except`
            for child in ast.walk(node):
                names |= _defined(child)
    return frozenset(names), classes


def _defined(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {name.id for target in node.targets for name in ast.walk(target) if isinstance(name, ast.Name)}
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return set()


def dotted_name_problem(name: str) -> str | None:
    parts = name.split(".")
    for length in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:length])
        if base.is_dir() and (base / "__init__.py").exists():
            module_file, rest = base / "__init__.py", parts[length:]
            break
        if base.with_suffix(".py").exists():
            module_file, rest = base.with_suffix(".py"), parts[length:]
            break
        if any(base.with_suffix(suffix).exists() for suffix in (".c", ".pyi")):
            return None  # a C extension (value_formats/_avro_columns.c): its names are not read here
    else:
        return f"module {name!r} does not exist"
    if not rest or rest[0].startswith("__"):
        return None  # the module itself, or a module attribute such as `__file__`
    names, classes = module_names(module_file)
    if "__getattr__" in names:
        return None
    if rest[0] not in names:
        if (module_file.parent / rest[0]).is_dir() or module_file.with_name(rest[0] + ".py").exists():
            return None  # a submodule named through its package
        return f"{name!r}: {'.'.join(parts[:len(parts) - len(rest)])} has no {rest[0]!r}"
    if len(rest) > 1 and rest[0] in classes and rest[1] not in classes[rest[0]]:
        return f"{name!r}: class {rest[0]} has no {rest[1]!r}"
    return None


TOP_LEVEL_DEFINITION = re.compile(r"^(?:async def|def|class) (\w+)", re.M)


@functools.cache
def package_index() -> tuple[dict[str, list[Path]], dict[str, list[Path]]]:
    """(module basename -> its files, top-level function or class name -> the modules defining it) of the package."""
    modules: dict[str, list[Path]] = {}
    definitions: dict[str, list[Path]] = {}
    for path in sorted((ROOT / "kafscale_lakehouse").rglob("*.py")):
        name = path.parent.name if path.name == "__init__.py" else path.stem
        modules.setdefault(name, []).append(path)
        for name in TOP_LEVEL_DEFINITION.findall(path.read_text()):
            definitions.setdefault(name, []).append(path)
    for path in sorted((ROOT / "kafscale_lakehouse").rglob("*.c")):
        modules.setdefault(path.stem, []).append(path)
    return modules, definitions


SHORT_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:\.[A-Za-z_]\w*)+")


def short_name_problem(span: str) -> str | None:
    """`appends.commit_append`, `engine.spark.table_source.read_table`: a code span naming a function or class of
    the package through a module must name a module that defines (or imports) it."""
    if not SHORT_NAME.fullmatch(span):
        return None
    parts = span.split(".")
    modules, definitions = package_index()
    for index in range(len(parts) - 1):
        name, module = parts[index + 1], ".".join(parts[:index + 1])
        files = [path for path in modules.get(parts[index], [])
                 if path.with_suffix("").as_posix().endswith(module.replace(".", "/"))
                 or path.parent.as_posix().endswith(module.replace(".", "/"))]
        if files:
            if any(path.suffix == ".c" or name in module_names(path)[0] or (path.parent / name).exists()
                   or path.with_name(name + ".py").exists() for path in files):
                return None
            if name in definitions:
                return f"`{span}`: {module} has no {name!r} (it is in {_where(definitions[name])})"
            return None
    if parts[0] in definitions or parts[0] in modules:
        return None  # a class's attribute, or a module whose name is not checked further
    if "_" in parts[0] and parts[1] in definitions:  # snake_case, as our modules are named
        return f"`{span}`: there is no module {parts[0]!r}; {parts[1]} is in {_where(definitions[parts[1]])}"
    return None


def _where(paths: list[Path]) -> str:
    return ", ".join(path.relative_to(ROOT / "kafscale_lakehouse").as_posix() for path in paths)


# ---- the CLI ----

@functools.cache
def cli_parser() -> argparse.ArgumentParser:
    return cli._build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


COMMAND_END = re.compile(r"[|;&#>)`]")


def cli_problem(words: list[str]) -> str | None:
    """`words` follow `kafscale-lakehouse` in a code span or line: each subcommand level and each `--option` must be
    the parser's."""
    parser = cli_parser()
    options = _options(parser)
    path = ["kafscale-lakehouse"]
    expecting_command = True
    for word in words:
        word = word.strip("[]")
        if not word or word.startswith(("<", "$", "…", "...", "{", "'", '"')) or word.isupper():
            expecting_command = False
            continue
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            if option not in options:
                return f"`{' '.join(path)}` has no option {option}"
            continue
        if word.startswith("-"):
            continue  # the Go processor's `-config=FILE`, or a value
        commands = _subcommands(parser)
        if expecting_command and commands:
            if word not in commands:
                return f"`{' '.join(path)}` has no command {word!r} (it has {', '.join(sorted(commands))})"
            parser = commands[word]
            options |= _options(parser)
            path.append(word)
            continue
        expecting_command = False  # a positional value (a path, a directory)
    return None


# ---- config keys ----

KNOWN_KEYS = frozenset(config_reference.key_paths())
SECTIONS = frozenset(path.split(".")[0].removesuffix("[]") for path in KNOWN_KEYS)
MAP_KEYS = frozenset(key.path for key in config_reference.config_keys()
                     if "map of" in config_reference.type_text(key.model.model_fields[key.field].annotation))


@functools.cache
def section_paths() -> tuple[str, ...]:
    """Where a YAML snippet may sit: the root, then every section (`mappings[]`, `mappings[].lfs`, …)."""
    return ("", *sorted({key.section_path for key in config_reference.config_keys() if key.section is not None}))


def _is_map_key(path: str) -> bool:
    return path in MAP_KEYS


def yaml_problem(document: object) -> str | None:
    """A config snippet fits under one section: every key it holds is a key of the models there."""
    if not isinstance(document, (dict, list)):
        return None
    top = document if isinstance(document, dict) else {k: None for item in document if isinstance(item, dict)
                                                      for k in item}
    all_names = {path.rsplit(".", 1)[-1].removesuffix("[]") for path in KNOWN_KEYS}
    if not any(str(key) in all_names for key in top):
        return None  # not a config snippet (dagster.yaml, Helm values, …)
    if isinstance(document, dict) and "type" in document and "attributes" in document:
        return None  # a dg `defs.yaml` (the component's attributes), not a lakehouse config
    known = KNOWN_KEYS
    best: list[str] | None = None
    for section in section_paths():
        if isinstance(document, list) and not section.endswith("[]"):
            continue
        paths = list(_snippet_paths(document, section + "." if section else ""))
        unknown = [path for path in paths if path not in known]
        if not unknown:
            return None
        if best is None or len(unknown) < len(best):
            best = unknown
    return f"config keys the models do not have: {', '.join(best or [])}"


def _snippet_paths(value: object, prefix: str) -> Iterator[str]:
    if isinstance(value, list):  # a list of entries of a list section (`- topic: …`)
        for item in value:
            yield from _snippet_paths(item, prefix)
        return
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        path = f"{prefix}{key}"
        yield path
        if _is_map_key(path):
            continue
        if isinstance(item, list) and any(isinstance(entry, dict) for entry in item):
            for entry in item:
                yield from _snippet_paths(entry, path + "[].")
        elif isinstance(item, dict):
            yield from _snippet_paths(item, path + ".")


DOTTED_KEY = re.compile(r"(?:[a-z_0-9]+(?:\[\])?)(?:\.[a-z_0-9]+(?:\[\])?)+")


def dotted_key_problem(span: str, *, in_code: bool = False) -> str | None:
    """`span` read as a config key; `in_code`: in a Python file, where `offsets.x`, `schema.x` and `etcd.x` name the
    package's modules of those names, not config keys."""
    if not DOTTED_KEY.fullmatch(span):
        return None
    span = span.removesuffix("[]")
    if span.endswith((".go", ".py", ".md", ".yaml", ".proto")):
        return None  # a file of that name (`iceberg.go`), not a key
    first, second = span.split(".")[:2]
    if first.removesuffix("[]") not in SECTIONS:
        return None
    if in_code and (ROOT / "kafscale_lakehouse" / first).is_dir():
        return None
    if first == "spark" and second not in {"master", "conf", "remote"}:
        return None  # a Spark property (`spark.driver.memory`), not our key
    known = KNOWN_KEYS
    candidates = (span, "mappings[]." + span)
    if any(candidate in known for candidate in candidates):
        return None
    if any(any(candidate.startswith(map_key + ".") for map_key in MAP_KEYS) for candidate in candidates):
        return None  # a key inside a free map (`iceberg.catalog.properties.…`)
    return f"config key `{span}` is not one of the models' keys"


# ---- reading a file ----

ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
DOTTED_NAME = re.compile(r"\b(?:kafscale_lakehouse_tests|kafscale_lakehouse)(?:\.[A-Za-z_]\w*)+")
PATH_TOKEN = re.compile(r"[\w.@-]*/[\w./@-]*")
MARKDOWN_NAME = re.compile(r"(?<![\w./-])[\w-]+\.md\b")
# `kafscale-lakehouse` run as a command: first in a code span or line (after a prompt, `VAR=value`s, a `…/bin/`
# folder), or after `&&`, `|`, `;`, `(`; not a release name (`helm install kafscale-lakehouse`) or a folder.
INVOCATION = re.compile(r"(?:^|[;&|(])\s*(?:\$\s+)?(?:\w+=\S*\s+)*(?:\S*bin/)?kafscale-lakehouse(?![\w-])"
                        r"((?:[ \t]+[^\s|;&#>)`]+)*)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", re.M | re.S)


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def problems_in(relative: str, text: str) -> list[Problem]:
    problems: list[Problem] = []

    def add(index: int, what: str) -> None:
        problems.append(Problem(relative, _line_of(text, index), what))

    for match in ISSUE.finditer(text):
        add(match.start(), f"names an issue ({match.group()}): say what the code does instead")
    for match in DOTTED_NAME.finditer(text):
        if text[:match.start()].endswith('getLogger("'):
            continue  # a logger's name, not a module
        if (problem := dotted_name_problem(match.group())) is not None:
            add(match.start(), problem)
    for match in PATH_TOKEN.finditer(text):
        if (problem := _path_problem(text, match)) is not None:
            add(match.start(), problem)
    for match in MARKDOWN_NAME.finditer(text):
        if match.group() not in file_names():
            add(match.start(), f"no file of the repository is named {match.group()}")
    code = [(match.start(1), match.group(1)) for match in CODE_SPAN.finditer(text)]
    code += [(match.start(3) + line.start(), line.group()) for match in FENCE.finditer(text)
             for line in re.finditer(r"[^\n]+", match.group(3))]
    for index, snippet in code:
        for command in INVOCATION.finditer(snippet):
            words = COMMAND_END.split(command.group(1), maxsplit=1)[0].split()
            if (problem := cli_problem(words)) is not None:
                add(index, problem)
        in_code = relative.endswith(".py")
        problem = dotted_key_problem(snippet.strip(), in_code=in_code) or short_name_problem(snippet.strip())
        if problem is not None:
            add(index, problem)
    if relative.endswith(".md"):
        for match in FENCE.finditer(text):
            if match.group(2) not in ("yaml", "yml"):
                continue
            try:
                documents = list(yaml.safe_load_all(textwrap.dedent(match.group(3))))
            except yaml.YAMLError as exc:
                add(match.start(), f"a YAML block that does not parse: {exc}")
                continue
            for document in documents:
                if (problem := yaml_problem(document)) is not None:
                    add(match.start(), problem)
    return problems


def _path_problem(text: str, match: re.Match[str]) -> str | None:
    token = match.group().rstrip(".")
    start, end = match.start(), match.start() + len(token)
    if "/" not in token or token.startswith(("/", ".", "@")) or "//" in token:
        return None
    if text[start - 1:start] in {"/", ":", "$", "~", "{", "<", "*"} or text[end:end + 1] in {"<", "{", "*", "…"}:
        return None  # part of a URL, a variable, a placeholder or a glob
    if not (token.endswith("/") or (token.rsplit(".", 1)[-1] in PATH_EXTENSIONS and "." in token.rsplit("/", 1)[-1])):
        return None
    if token.split("/", 1)[0] not in path_roots():
        return None  # a path of somebody else's (a user's project, an object key)
    if path_exists(token):
        return None
    return f"path {token} is no file or folder of the repository"


# ---- the files ----

def documented_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("kafscale_lakehouse", "kafscale_lakehouse_tests", "benchmarks", "scripts", "docs/hooks"):
        files += sorted((ROOT / folder).rglob("*.py"))
    # This file plants bad references on purpose (below), so it is not read.
    return [path for path in files if "__pycache__" not in path.parts and path != Path(__file__).resolve()]


def test_docs_and_comments_name_only_what_exists() -> None:
    problems = []
    for path in documented_files():
        problems += problems_in(path.relative_to(ROOT).as_posix(), path.read_text())
    assert not problems, "\n".join(map(str, problems))


def test_the_configuration_reference_covers_every_key() -> None:
    reference = config_reference.reference_markdown()
    for key in config_reference.config_keys():
        name = key.path.rsplit(".", 1)[-1]
        assert f"| `{name}` |" in reference, key.path
    assert reference.count("\n| `") == len(list(config_reference.config_keys()))


# ---- the check itself, on planted references ----

GOOD_PAGE = """
`kafscale_lakehouse.engine.tables.appends.commit_append` in `engine/tables/appends.py`, see docs/architecture.md.
`kafscale-lakehouse offsets reset --topic t --from-table --yes`, `processor.max_bytes_per_run`, `spark.driver.memory`.

```yaml
mappings:
  - topic: orders
    table: shop.orders
    lfs: {mode: resolve}
    table_properties: {write.format.default: parquet}
```
"""

PLANTED = {
    "module": ("`kafscale_lakehouse.engine.spark_ingestion`", "kafscale_lakehouse.engine has no 'spark_ingestion'"),
    "attribute": ("`kafscale_lakehouse.engine.tables.appends.commit_everything`", "has no 'commit_everything'"),
    "path": ("see `engine/tables/table_offsets.py`", "path engine/tables/table_offsets.py"),
    "markdown file": ("as DESIGN.md says", "named DESIGN.md"),
    "command": ("`kafscale-lakehouse offsets rewind --topic t`", "has no command 'rewind'"),
    "option": ("`kafscale-lakehouse maintain --tables rpc.pizzas`", "has no option --tables"),
    "short name": ("`table_offsets.commit_append`", "there is no module 'table_offsets'; commit_append is in"),
    "moved name": ("`rewrites.commit_append`", "rewrites has no 'commit_append'"),
    "dotted config key": ("`processor.max_bytes_per_runs`", "config key `processor.max_bytes_per_runs`"),
    "yaml config key": ("```yaml\nmappings:\n  - topic: t\n    table: a.b\n    lfs: {mod: resolve}\n```",
                        "mappings[].lfs.mod"),
    "issue": ("as issue 22 asked", "names an issue"),
}


def test_a_page_naming_what_exists_has_no_problem(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(GOOD_PAGE)
    assert problems_in("page.md", page.read_text()) == []


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_planted_bad_reference_fails_the_check(tmp_path: Path, kind: str) -> None:
    text, expected = PLANTED[kind]
    page = tmp_path / "page.md"
    page.write_text(GOOD_PAGE + "\n" + text + "\n")
    problems = problems_in("page.md", page.read_text())
    assert len(problems) == 1, problems
    assert expected in problems[0].what
    assert problems[0].line == GOOD_PAGE.count("\n") + 2


def test_a_comment_in_code_is_read_too() -> None:
    source = "def f() -> None:\n    # the commit: `table_offsets.commit_append` (kafscale_lakehouse.table_offsets)\n"
    problems = problems_in("module.py", source)
    assert [problem.line for problem in problems] == [2, 2]
    assert sorted(problem.what.split(":")[0] for problem in problems) == [
        "'kafscale_lakehouse.table_offsets'", "`table_offsets.commit_append`"]

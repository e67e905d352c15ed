"""Strict JSON reading shared by every tfplace file format.

`FieldReader` walks a parsed JSON object and turns every type error, missing key or unknown key
into one `InputError` that names the file, the full field path and the fix. File formats build
their typed values from it; nothing else in tfplace parses JSON by hand.

Strictness, on purpose: a key given twice in one object is an error (plain `json` keeps the last
one silently); an unknown key is an error that lists the known keys and the closest one; NaN and
Infinity are not numbers; a path field is resolved against named base folders and must exist;
the file itself must be a regular file (a folder, FIFO or device is refused without opening it,
tfplace.formats.files). A UTF-8 byte-order mark at the start of a file is skipped (editors on
Windows write one).

Example:
    r = FieldReader.from_file("cluster.json", expected_format="tfplace.cluster")
    name = r.get("name", str)
    for dev in r.items("devices"):
        mem = dev.get("memory_bytes", int, check=lambda v: v > 0, must="be > 0")
    r.reject_unknown()
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import json
import math
import os
import secrets
from typing import IO, Any, Callable, Iterator, List, Optional, Sequence, Tuple, Type, Union

from tfplace.formats.errors import InputError
from tfplace.formats.files import TOP_LEVEL, input_problem, require_regular_file

_MISSING = object()
TypeSpec = Union[Type, Tuple[Type, ...]]


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs):
    """json object_pairs_hook: the stdlib keeps the last of two equal keys; we refuse."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _type_name(t: TypeSpec) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true/false",
             list: "a list", dict: "an object", type(None): "null"}
    if isinstance(t, tuple):
        return " or ".join(names.get(x, x.__name__) for x in t)
    return names.get(t, t.__name__)


def integral(value: Any) -> Optional[int]:
    """`value` as an int where a file gives an integer: an int, or a number with no fraction
    written as a float (JSON writers emit 16e9 or 16.0 for an integer); None for anything else
    (16.5, a bool, a string, NaN). Every integer tfplace reads from a file goes through here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    return value


def _matches(value: Any, t: TypeSpec) -> bool:
    types = t if isinstance(t, tuple) else (t,)
    for x in types:
        if x is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return math.isfinite(value)
        if x is int:
            if integral(value) is not None:
                return True
            continue
        if isinstance(value, x):
            return True
    return False


def _coerce(value: Any, t: TypeSpec) -> Any:
    types = t if isinstance(t, tuple) else (t,)
    if int in types and float not in types and isinstance(value, float):
        return integral(value)
    if float in types and int not in types and isinstance(value, int):
        return float(value)
    return value


class FieldReader:
    """A view on one JSON object (or list) inside a file, with the path that leads to it."""

    def __init__(self, data: Any, source: str, path: str = ""):
        self.data = data
        self.source = source
        self.path = path
        self._seen: set = set()

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: Union[str, os.PathLike], expected_format: Optional[str] = None,
                  supported_versions: Sequence[int] = (1,)) -> "FieldReader":
        """Parses `path` as a JSON object; checks its "format" and "version" keys if asked."""
        source = require_regular_file(path, field=TOP_LEVEL)  # never opens a FIFO or a device
        try:
            with open(source, "r", encoding="utf-8-sig") as f:  # a byte-order mark (Windows editors) is skipped
                text = f.read()
            if not text.strip():
                raise InputError(source, TOP_LEVEL, "the file is empty", "write the JSON object { ... } into it")
            data = json.loads(text, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as e:
            raise InputError(source, f"line {e.lineno} column {e.colno}", f"not valid JSON ({e.msg})",
                             "repair the JSON syntax (a truncated file or a trailing comma?)") from None
        except _DuplicateKey as e:
            raise InputError(source, e.key, "key given twice in one object",
                             "keep one of the two entries (JSON would silently keep the last)") from None
        except UnicodeDecodeError:
            raise InputError(source, TOP_LEVEL, "not a UTF-8 text file", "give a JSON file") from None
        except OSError as e:
            raise InputError(source, TOP_LEVEL, f"cannot be read ({e.strerror})",
                             "check the file's permissions") from None
        return cls.from_data(data, source, expected_format, supported_versions)

    @classmethod
    def from_data(cls, data: Any, source: str, expected_format: Optional[str] = None,
                  supported_versions: Sequence[int] = (1,)) -> "FieldReader":
        if not isinstance(data, dict):
            raise InputError(source, TOP_LEVEL, f"must be a JSON object, got {_type_name(type(data))}",
                             "wrap the content in { ... }")
        reader = cls(data, source)
        if expected_format is not None:
            fmt = reader.get("format", str, default=expected_format)
            if fmt != expected_format:
                raise InputError(source, "format", f"is {fmt!r}, expected {expected_format!r}",
                                 f"pass a {expected_format} file here")
            version = reader.get("version", int, default=supported_versions[-1])
            if version not in supported_versions:
                raise InputError(source, "version", f"version {version} is not supported",
                                 f"use one of {list(supported_versions)}")
        return reader

    # ---- errors ------------------------------------------------------------------------------
    def field_path(self, key: Union[str, int, None] = None) -> str:
        if key is None:
            return self.path
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: Union[str, int, None], problem: str, fix: str) -> InputError:
        return InputError(self.source, self.field_path(key), problem, fix)

    # ---- access ------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return isinstance(self.data, dict) and key in self.data

    def get(self, key: str, t: TypeSpec, default: Any = _MISSING,
            check: Optional[Callable[[Any], bool]] = None, must: str = "be valid",
            fix: Optional[str] = None) -> Any:
        """Returns data[key] checked against type `t` (and `check`), or `default` if absent."""
        self._seen.add(key)
        if key not in self.data or (self.data[key] is None and default is not _MISSING
                                    and not _matches(None, t)):
            if default is _MISSING:
                raise self.error(key, "missing", fix or f"add the field ({_type_name(t)})")
            return default
        value = self.data[key]
        if not _matches(value, t):
            raise self.error(key, f"must be {_type_name(t)}, got {json.dumps(value)[:60]}",
                             fix or f"give {_type_name(t)}")
        value = _coerce(value, t)
        if check is not None and not check(value):
            raise self.error(key, f"must {must}, got {json.dumps(value)[:60]}",
                             fix or (f"give a value that is {must[3:]}" if must.startswith("be ")
                                     else f"give a value that does {must}"))
        return value

    def child(self, key: str, default_empty: bool = False) -> "FieldReader":
        """The nested object at `key`."""
        if default_empty and key not in self.data:
            self._seen.add(key)
            return FieldReader({}, self.source, self.field_path(key))
        value = self.get(key, dict)
        return FieldReader(value, self.source, self.field_path(key))

    def items(self, key: str, default_empty: bool = False, min_len: int = 0) -> Iterator["FieldReader"]:
        """Readers for each object of the list at `key`."""
        values = self.get(key, list, default=[] if default_empty else _MISSING)
        if len(values) < min_len:
            raise self.error(key, f"needs at least {min_len} entries, got {len(values)}",
                             "add entries")
        base = self.field_path(key)
        for i, value in enumerate(values):
            if not isinstance(value, dict):
                raise InputError(self.source, f"{base}[{i}]",
                                 f"must be an object, got {json.dumps(value)[:60]}", "give { ... }")
            yield FieldReader(value, self.source, f"{base}[{i}]")

    def entries(self) -> Iterator[Tuple[str, "FieldReader"]]:
        """(key, reader) for each object-valued entry of this object (a name -> object map)."""
        for key, value in self.data.items():
            self._seen.add(key)
            if not isinstance(value, dict):
                raise self.error(key, f"must be an object, got {json.dumps(value)[:60]}", "give { ... }")
            yield key, FieldReader(value, self.source, self.field_path(key))

    def strings(self, key: str, default: Any = _MISSING, min_len: int = 0) -> List[str]:
        """The list of strings at `key` (each element checked, with its index in the message)."""
        values = self.get(key, list, default=default)
        if values is default and default is not _MISSING:
            return values
        if len(values) < min_len:
            raise self.error(key, f"needs at least {min_len} entries, got {len(values)}", "add entries")
        for i, value in enumerate(values):
            if not isinstance(value, str) or not value:
                raise InputError(self.source, f"{self.field_path(key)}[{i}]",
                                 f"must be a non-empty string, got {json.dumps(value)[:60]}",
                                 "give a string")
        return list(values)

    def expect_keys(self, known: Sequence[str],
                    also_allowed: Sequence[str] = ("format", "version", "comment")) -> None:
        """Rejects unknown keys before any value is read, so that a misspelt required key is
        reported as the typo it is (with the closest known key), not as a missing field."""
        self._seen.update(known)
        self.reject_unknown(also_allowed)

    def reject_unknown(self, also_allowed: Sequence[str] = ("format", "version", "comment")) -> None:
        """Raises for any key that was never read: a typo must not be silently ignored."""
        allowed = self._seen | set(also_allowed)
        unknown = sorted(k for k in self.data if k not in allowed)
        if unknown:
            known = sorted(self._seen)
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise self.error(unknown[0], "unknown key",
                             f"{hint}remove it or use one of {known}" if known else "remove it")

    def get_path(self, key: str, base_dirs: Sequence[str], default: Any = _MISSING,
                 what: str = "file") -> Any:
        """The path string at `key`, resolved (see `resolve_path`); `default` if absent."""
        value = self.get(key, str, default=default, check=lambda v: bool(v.strip()), must="be non-empty")
        if value is default and default is not _MISSING:
            return value
        return resolve_path(value, self.source, self.field_path(key), base_dirs, what)


def resolve_path(value: str, source: str, field: str, base_dirs: Sequence[str], what: str = "file") -> str:
    """Absolute path of `value`: itself if absolute, else the first of base_dirs/value that
    exists. Raises InputError naming every place it looked when none exists, and when the one
    found is not a regular file (a folder, FIFO or device; tfplace.formats.files)."""
    value = os.path.expanduser(value)
    candidates = [value] if os.path.isabs(value) else [os.path.join(b, value) for b in base_dirs]
    for c in candidates:
        if os.path.exists(c):
            found = os.path.normpath(os.path.abspath(c))
            problem = input_problem(found)  # a folder, FIFO or device: refused now, never opened later
            if problem:
                raise InputError(source, field, f"{what} {found}: {problem[0]}", problem[1])
            return found
    looked = ", ".join(os.path.normpath(c) for c in candidates)
    rel = " (relative paths are resolved against the folder of the file that names them, " \
          "then the folder of tfplace's bundled clusters/)" if not os.path.isabs(value) else ""
    raise InputError(source, field, f"{what} {value!r} not found (looked at {looked})",
                     f"check the path{rel}")


def atomic_write(path: Union[str, os.PathLike], write: Callable[[IO], None], binary: bool = False) -> None:
    """Calls `write(f)` on a temporary file beside `path` (<path>.tmp<pid>-<random>; text in UTF-8,
    or bytes when `binary`), then renames it to `path`, so an interrupted or failed write never
    leaves a truncated file behind, nor the temporary one (it is removed on any error, Ctrl-C
    included). A file system that refuses the write (full, read-only, over quota) raises InputError
    naming `path`, not a bare OSError.

    The temporary name is new for each call and created exclusively: the pid alone is shared by the
    threads of a process and, across pid namespaces, by processes of two containers that share a
    folder; two writers of one path under one name wrote into each other's file, and one renamed
    the other's half-written file into place."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}-{secrets.token_hex(4)}"
    created = False
    try:
        with (open(tmp, "xb") if binary else open(tmp, "x", encoding="utf-8")) as f:
            created = True
            write(f)
        os.replace(tmp, path)
    except OSError as err:
        full = err.errno in (errno.ENOSPC, errno.EDQUOT)
        raise InputError(path, "", f"cannot be written ({err.strerror or err})",
                         "free space or choose another folder" if full else "choose another folder") from None
    finally:
        if created and os.path.lexists(tmp):  # never another writer's file of the same name
            with contextlib.suppress(OSError):
                os.remove(tmp)


def write_json(path: Union[str, os.PathLike], data: Any) -> None:
    """Writes `data` as indented JSON atomically (atomic_write), so an interrupted write never
    leaves a truncated file behind. NaN/Infinity are refused: they are not JSON and other readers
    would reject the file."""
    def dump(f) -> None:
        json.dump(data, f, indent=1, sort_keys=False, allow_nan=False)
        f.write("\n")
    atomic_write(path, dump)

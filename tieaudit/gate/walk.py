"""The walk of one folder argument: model folders as one target each, checkpoint files found, and
every other file's verdict (see ``gate.discover`` for the rules). Imported only when a folder is
given: a file named alone needs none of the format knowledge a walk uses."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from tieaudit.core.errors import InputError
from tieaudit.core.globs import posix_relative
from tieaudit.formats.bare_pickle import scan
from tieaudit.formats.hf.layouts import config_only_reason, is_model_folder, loader_gaps
from tieaudit.formats.hf_covered import beside_sets, covered_files
from tieaudit.formats.hf_dir import hub_blobs
from tieaudit.formats.hf_ties import CONFIG
from tieaudit.formats.magic import GGUF_MAGIC, is_lfs_pointer, might_be_torch, read_head
from tieaudit.formats.torch_sniff import is_legacy_stream, is_torch_tar, is_torch_zip
from tieaudit.formats.torch_takes import hides_code
from tieaudit.formats.torch_tar_walk import scan_tar
from tieaudit.gate.files import (
    CHECKPOINT_SUFFIXES,
    EXCLUDED,
    HIDDEN,
    LINKED_FOLDER,
    NOT_REGULAR,
    OUTSIDE_FOLDER,
    OUTSIDE_LINK,
    TORCH_SUFFIXES,
    FileVerdict,
    covered_reason,
    skip_reason,
    skipped_name,
)
from tieaudit.gate.glob_use import ExcludeMatches
from tieaudit.gate.hidden import HiddenCount, searched_folder, too_many
from tieaudit.gate.targets import PathError, Target

LINK_OUTSIDE = "is a link to a file outside the folder searched; name it on the command line to audit it"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


@dataclass(frozen=True, kw_only=True)
class _Folder:
    """A folder being walked: its entries still to look at, and how many targets came before it."""

    path: str
    """The folder."""
    entries: Iterator[os.DirEntry[str]]
    """Its entries not yet looked at, by name."""
    found_before: int
    """Targets found before entering it; -1 for a model folder (a target itself, whatever it holds)."""
    hidden: str = ""
    """The hidden folder it lies under, or is ("" when none): searched only for code (gate.hidden)."""


class FolderWalk:
    """A depth-first walk of one folder argument, without recursion (a deep tree cannot exhaust
    the stack) and without entering a folder twice (bind mounts cannot make it endless)."""

    def __init__(
        self, root: str, exclude: tuple[str, ...], errors: list[PathError], *, matches: ExcludeMatches
    ) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.exclude = exclude
        self.matches = matches
        self.errors = errors
        self.files: list[FileVerdict] = []
        self.covered: dict[str, str] = {}
        """Absolute path of a file a model folder's reader reads -> that folder (the target)."""
        self.found = 0
        self.seen: set[tuple[int, int]] = set()
        self.stack: list[_Folder] = []
        self.hidden = HiddenCount()

    def _target(self, path: str) -> Target:
        """The argument itself as given; what is found under it, normalised (no ./ or //)."""
        self.found += 1
        if path == self.root:
            return Target(path, explicit=True)
        return Target(os.path.normpath(path), explicit=False)

    def _error(self, path: str, message: str) -> None:
        self.errors.append(PathError(path=path, message=message))
        self.files.append(FileVerdict(path=os.path.normpath(path), verdict="error", reason=message))

    def _skip(self, path: str, reason: str, *, folder: bool = False) -> None:
        shown = os.path.normpath(path) + (os.sep if folder else "")
        self.files.append(FileVerdict(path=shown, verdict="skipped", reason=reason))

    def _audited(self, target: Target) -> Target:
        if not os.path.isdir(target.path):
            self.files.append(FileVerdict(path=target.path, verdict="audited", target=target.path))
        return target

    def _enter(self, folder: str, *, model: Target | None = None, hidden: str = "") -> None:
        try:
            status = os.stat(folder)
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            self._error(folder, f"cannot list folder: {_reason(exc)}")
            return
        if (status.st_dev, status.st_ino) in self.seen:
            return  # the same folder again, through a bind mount
        self.seen.add((status.st_dev, status.st_ino))
        for path, message in loader_gaps(folder):  # a module, component or shard its loader needs
            self._error(path, message)
        if model is not None:
            for name in covered_files(folder):
                self.covered.setdefault(os.path.abspath(os.path.join(folder, name)), model.path)
        self.stack.append(
            _Folder(
                path=folder, entries=iter(entries), found_before=-1 if model else self.found, hidden=hidden
            )
        )

    def _model(self, folder: str) -> Iterator[Target]:
        """A model folder as one target (its files covered), and each weight set beside its weights
        (a variant, an adapter) as one more, named by its file (the files read with it covered by it)."""
        model = self._target(folder)
        yield model
        self._enter(folder, model=model)
        for named, parts in beside_sets(folder):  # each yielded where the walk reaches its file
            variant = os.path.normpath(os.path.join(folder, named))
            for name in (named, *parts):
                self.covered[os.path.abspath(os.path.join(folder, name))] = variant

    def _is_folder(self, entry: os.DirEntry[str]) -> bool | None:
        """A folder to look into (True), a file to consider (False), or None (error recorded)."""
        try:
            return entry.is_dir(follow_symlinks=False)  # a link to a folder is not followed
        except OSError as exc:
            self._error(entry.path, f"cannot read: {_reason(exc)}")
            return None

    def _is_checkpoint(self, entry: os.DirEntry[str]) -> bool:
        """A regular file (a link to one inside the folder searched) holding a checkpoint by its name
        and first bytes; any other file gets its verdict here."""
        try:
            link = entry.is_symlink()  # from the listing: known even where lstat is refused
        except OSError:
            link = False
        try:
            status = os.stat(entry.path)  # follows links: loops and over-long targets fail here
        except OSError as exc:
            what = "a link that cannot be followed" if link else "cannot read"
            self._error(entry.path, f"{what}: {_reason(exc)}")
            return False
        if stat.S_ISDIR(status.st_mode):
            if self._link_inside(entry.path):  # its files are searched where they lie
                self._skip(entry.path, LINKED_FOLDER, folder=True)
            else:  # found nowhere else: searched for code, as a hidden folder is
                self._skip(entry.path, searched_folder(OUTSIDE_FOLDER), folder=True)
                if self.hidden.admit(entry.path):
                    self._enter(entry.path, hidden=entry.path)
            return False
        if not stat.S_ISREG(status.st_mode):
            self._skip(entry.path, NOT_REGULAR)
            return False
        named = entry.name.endswith(CHECKPOINT_SUFFIXES + TORCH_SUFFIXES)
        if link and not self._link_inside(entry.path):
            if named:
                self._error(entry.path, LINK_OUTSIDE)
                return False
            if hides_code(os.path.realpath(entry.path)):
                return True  # a link leads nowhere safer than its file
            self._skip(entry.path, OUTSIDE_LINK)
            return False
        try:
            head, _ = read_head(entry.path)
        except InputError:  # unreadable now: a checkpoint's audit says why, in one line
            if named:
                return True
            head = b""
        if head.startswith(GGUF_MAGIC):  # a GGUF file under any name
            return True
        if is_lfs_pointer(head, status.st_size):
            self._skip(entry.path, skip_reason(head, entry.name, status.st_size))
            return False
        if named and (entry.name.endswith(CHECKPOINT_SUFFIXES) or might_be_torch(head)):
            return True
        tar = is_torch_tar(entry.path, head)
        if not tar and (is_torch_zip(entry.path, head) or is_legacy_stream(entry.path, head)):
            return True  # torch.load takes it, whatever its name
        try:  # a tar whose members, or a pickle torch.load(weights_only=False) unpickles before it fails
            bare = scan_tar(entry.path) if tar else scan(entry.path, head, status.st_size, until_code=True)
        except InputError as exc:
            self._error(entry.path, exc.message)
            return False
        if bare is not None and bare.audited:
            return True
        plain = bare.reason if bare is not None and bare.plain else ""
        self._skip(entry.path, plain or skip_reason(head, entry.name, status.st_size))
        return False

    def _search_skipped(
        self, entry: os.DirEntry[str], folder: _Folder, *, reason: str, is_folder: bool
    ) -> Iterator[Target]:
        """An entry skipped for its name (reason): a folder is entered, searched for code only; a
        file is audited when torch.load would run code from it; bounded per folder (gate.hidden)."""
        root = folder.hidden or entry.path
        if not self.hidden.admit(root):
            self._error(root, too_many(self.hidden.limit, posix_relative(root, self.matches.base)))
            while self.stack and self.stack[-1].hidden == root:
                self.stack.pop()  # the rest of that hidden folder is not searched
            return
        kind, path = ("folder" if is_folder else "file"), entry.path
        if not is_folder and os.path.islink(entry.path):
            if self._link_inside(entry.path):
                kind = ""  # its target is searched where it lies
            else:  # leading outside: searched, as a link elsewhere is (a link never hides code)
                kind, path = ("folder" if os.path.isdir(entry.path) else "file"), os.path.realpath(entry.path)
        if kind == "folder":
            if not folder.hidden:
                self._skip(entry.path, searched_folder(reason), folder=True)
            self._enter(entry.path, hidden=root)
        elif kind == "file" and hides_code(path):
            yield self._audited(self._target(entry.path))
        elif not folder.hidden:
            self._skip(entry.path, reason)

    def _link_inside(self, path: str) -> bool:
        """A link's file lies inside the folder searched, or in the hub cache's blobs folder of the
        snapshot holding it (as the model folder reader allows)."""
        real = os.path.realpath(path)
        if _inside(real, self.real_root):
            return True
        blobs = hub_blobs(os.path.dirname(path))
        return blobs is not None and _inside(real, os.path.realpath(blobs))

    def _excluded(self, entry: os.DirEntry[str]) -> str:
        """The first --exclude pattern matching the entry, or empty."""
        return self.matches.first_match(entry.path, self.root, self.exclude) if self.exclude else ""

    def _covered(self, entry: os.DirEntry[str]) -> bool:
        model = self.covered.get(os.path.abspath(entry.path))
        if model is None:
            return False
        path = os.path.normpath(entry.path)
        reason = covered_reason(model, folder=True, onnx=False)
        self.files.append(FileVerdict(path=path, verdict="covered", reason=reason, target=model))
        return True

    def _folder_done(self, folder: _Folder) -> Iterator[Target]:
        # a config.json folder holding nothing to audit (no weights, no ONNX export beside it) is
        # one target: its audit says what is missing
        if folder.hidden:
            return
        if self.found != folder.found_before or not os.path.lexists(os.path.join(folder.path, CONFIG)):
            return
        why = config_only_reason(folder.path)  # a module's or a tool's config is no model
        if why:
            self._config_only(folder.path, why)
        else:
            yield self._target(folder.path)

    def _config_only(self, folder: str, why: str) -> None:
        """The verdict of a folder's config.json that describes no model: skipped, saying why."""
        config = os.path.normpath(os.path.join(folder, CONFIG))
        for at in range(len(self.files) - 1, -1, -1):
            if self.files[at].path == config:
                self.files[at] = FileVerdict(path=config, verdict="skipped", reason=why)
                return

    def targets(self) -> Iterator[Target]:
        """Model folders as one target each (their other files searched), other folders walked,
        checkpoint files found; every other file gets its verdict."""
        if is_model_folder(self.root):
            yield from self._model(self.root)
        else:
            self._enter(self.root)
        while self.stack:
            folder = self.stack[-1]
            entry = next(folder.entries, None)
            if entry is None:
                self.stack.pop()
                yield from self._folder_done(folder)
                continue
            if self.covered.get(os.path.abspath(entry.path)) == os.path.normpath(entry.path):
                yield self._audited(self._target(entry.path))  # a weight set beside a model's weights
                continue
            if self._covered(entry):
                continue
            skipped = HIDDEN if folder.hidden else skipped_name(entry.name)
            pattern = self._excluded(entry)
            if skipped or pattern:
                try:
                    folder_entry = entry.is_dir(follow_symlinks=False)
                except OSError:
                    folder_entry = False
                if pattern:
                    self._skip(entry.path, EXCLUDED.format(pattern=pattern), folder=folder_entry)
                else:  # a name never hides code
                    yield from self._search_skipped(entry, folder, reason=skipped, is_folder=folder_entry)
                continue
            is_folder = self._is_folder(entry)
            if is_folder and is_model_folder(entry.path):
                yield from self._model(entry.path)
            elif is_folder:
                self._enter(entry.path)
            elif is_folder is False and self._is_checkpoint(entry):
                yield self._audited(self._target(entry.path))

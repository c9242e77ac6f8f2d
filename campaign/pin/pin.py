"""`pin MANIFEST`: what a cloud deploy needs pinned, resolved at model.commit and written into the manifest.

- model.weight_files: each file's sha256 from the Hub's metadata (campaign/pin/hub.py), no download;
- tokenizer.files: the pinned tokenizer files (and chat_template.jinja when the commit has one, which
  the server reads before tokenizer_config.json) downloaded beside tokenizer.path and hashed; a
  tokenizer.chat_template the manifest spells out is replaced by the checkpoint's when they differ;
- fleets[].serving.image: each tag's manifest digest from its registry (campaign/pin/registry.py).

A tag whose digest differs from a real one already pinned is refused unless `update`: that is a new
image, and so a new campaign digest. The illustrative values of the examples are replaced freely.
Everything is resolved and checked before anything is written; a refusal writes nothing.
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from campaign.aws.cloud_checks import ILLUSTRATIVE_VALUES
from campaign.pin.errors import PinError
from campaign.pin.hub import HubRepo, download_tokenizer_files, weight_hashes, write_files
from campaign.pin.registry import image_tag, resolve_digest
from campaign.pin.yaml_edit import AddEntry, Edit, SetValue, apply_edits, edit_issue
from core.manifest import (
    CHAT_TEMPLATE_FILE,
    Issue,
    Manifest,
    checkpoint_chat_template,
    load_manifest,
    manifest_from_data,
    parse_yaml,
    semantic_issues,
)


@dataclass
class Pinned:
    """What `pin` resolved and wrote."""

    source: Path
    out: Path
    old_text: str
    new_text: str
    notes: list[str] = field(default_factory=list)

    @property
    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.old_text.splitlines(keepends=True),
                self.new_text.splitlines(keepends=True),
                fromfile=str(self.source),
                tofile=str(self.out),
            )
        )


def pin_manifest(source: Path, out: Path, *, update: bool = False) -> Pinned:
    """Resolve every pin of the manifest at `source` and write the pinned manifest to `out`."""
    m = load_manifest(source, check_files=False)  # the tokenizer files may not be here yet
    hub = HubRepo.from_environment(m.model.repo, m.model.commit)
    edits: list[Edit] = [
        SetValue(("model", "weight_files", name), digest)
        for name, digest in weight_hashes(hub, sorted(m.model.weight_files)).items()
    ]
    issues, image_edits = _image_edits(m, update=update)
    if issues:
        raise PinError(issues, str(source))
    edits += image_edits
    notes: list[str] = []
    old_text = source.read_text(encoding="utf-8")
    # The tokenizer files are downloaded into a staging directory and every check reads them
    # there; they are moved into place, and the manifest written, only once all have passed: a
    # refusal leaves the manifest and the tokenizer directory as they were.
    with tempfile.TemporaryDirectory(prefix="pin-tokenizer-") as tmp:
        stage = Path(tmp)
        tokenizer_edits, fetched = _tokenizer_edits(m, hub, stage, notes)
        edits += tokenizer_edits
        try:
            new_text = apply_edits(old_text, edits)
        except ValueError as exc:
            raise PinError([edit_issue(exc)], str(source)) from None
        # What load_manifest(out) will say of the written manifest with its files in place.
        pinned = manifest_from_data(parse_yaml(new_text, str(out)), source=out)
        issues = semantic_issues(_reading_from(pinned, stage) if fetched else pinned)
        if issues:
            raise PinError(issues, str(out))
        if fetched and m.tokenizer_dir is not None:
            m.tokenizer_dir.mkdir(parents=True, exist_ok=True)
            for name in fetched:
                shutil.move(stage / name, m.tokenizer_dir / name)
    out.write_text(new_text, encoding="utf-8")  # last: it never pins files that are not in place
    return Pinned(source, out, old_text, new_text, notes)


def _reading_from(m: Manifest, stage: Path) -> Manifest:
    """`m` with its tokenizer files read from `stage` instead of beside tokenizer.path."""
    path = str(stage / Path(m.tokenizer.path or "").name)
    return m.model_copy(update={"tokenizer": m.tokenizer.model_copy(update={"path": path})})


def _image_edits(m: Manifest, *, update: bool) -> tuple[list[Issue], list[Edit]]:
    issues: list[Issue] = []
    edits: list[Edit] = []
    for i, f in enumerate(m.fleets):
        where = f"fleets[{i}].serving.image"
        name, _, pinned = f.serving.image.partition("@")
        ref = image_tag(f.serving.image)
        if ref is None:
            issues.append(
                Issue(where, f"no tag to resolve: write the tag the image is pinned from ({name}:TAG@{pinned})")
            )
            continue
        digest = resolve_digest(ref)
        if digest == pinned:
            continue
        if pinned.removeprefix("sha256:") not in ILLUSTRATIVE_VALUES and not update:
            issues.append(
                Issue(
                    where,
                    f"tag {ref.tag} is now {digest}, not the pinned {pinned}: a different image (and campaign "
                    "digest); pass --update to pin it",
                )
            )
            continue
        edits.append(SetValue(("fleets", i, "serving", "image"), f"{name}@{digest}"))
    return issues, edits


def _tokenizer_edits(m: Manifest, hub: HubRepo, stage: Path, notes: list[str]) -> tuple[list[Edit], list[str]]:
    """The tokenizer files' hashes and the chat template, and the names of the files downloaded
    into `stage` (to be moved beside tokenizer.path once every check has passed)."""
    t, into = m.tokenizer, m.tokenizer_dir
    if t.kind != "huggingface" or not t.files or into is None:
        notes.append(
            "tokenizer: no pinned checkpoint files to resolve (kind huggingface with tokenizer.files lists them; "
            "`validate --for cloud` says what it needs)"
        )
        return [], []
    names = sorted(t.files)
    if CHAT_TEMPLATE_FILE not in names and hub.exists(CHAT_TEMPLATE_FILE):
        names.append(CHAT_TEMPLATE_FILE)  # the server reads it before tokenizer_config.json's template
    contents = download_tokenizer_files(hub, names)
    hashes = write_files(contents, stage)
    if CHAT_TEMPLATE_FILE not in contents and (into / CHAT_TEMPLATE_FILE).is_file():
        # the one file besides these the checks read (an unpinned one is refused): staged as well,
        # so the staged directory reads as the tokenizer directory will after the move
        shutil.copyfile(into / CHAT_TEMPLATE_FILE, stage / CHAT_TEMPLATE_FILE)
    notes.append(f"tokenizer: wrote {', '.join(names)} at model.commit to {into}")
    edits: list[Edit] = [
        SetValue(("tokenizer", "files", n), h) if n in t.files else AddEntry(("tokenizer", "files"), n, h)
        for n, h in hashes.items()
    ]
    if t.chat_template is not None:
        pinned = m.model_copy(update={"tokenizer": t.model_copy(update={"files": hashes, "chat_template": None})})
        found = checkpoint_chat_template(_reading_from(pinned, stage))
        if isinstance(found, Issue):
            raise PinError([found], str(m.source))
        if found[1] != t.chat_template:
            edits.append(SetValue(("tokenizer", "chat_template"), found[1]))
            notes.append(f"tokenizer.chat_template: replaced by the checkpoint's, from {found[0]}")
    return edits, names

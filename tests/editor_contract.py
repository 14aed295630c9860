"""The Editor contract, checked the same way for every adapter.

A test class for an editor subclasses :class:`EditorContract` and provides two fixtures:
``editor`` (ready to edit; a simulated one with the design of the requests attached) and
``edit_requests`` (a few requests, enough that every status in ``expected_statuses`` occurs).
The contract: one outcome per request, in order; a known status; ``ok`` carries an RGB uint8
image; ``refused`` names its kind; ``error`` says what went wrong; the source images are left
alone; and requests carry nothing but what a real editor needs (no demographic label).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from acrb.demographics import SOURCE_DIMENSIONS
from acrb.models.base import (
    Editor,
    EditorConfig,
    EditOutcome,
    EditRequest,
    GenerationRequest,
    Generator,
    Outcome,
)

#: The fields an EditRequest may have: what a real image editor needs, and nothing else.
ALLOWED_REQUEST_FIELDS = ("request_id", "instruction", "seed", "source_image", "extra_images")
#: The fields a GenerationRequest may have: the prompt and what names and seeds it.
ALLOWED_GENERATION_FIELDS = ("request_id", "prompt", "seed")
#: Every demographic label a source can carry, in the canonical spelling.
SOURCE_LABELS = tuple(label for labels in SOURCE_DIMENSIONS.values() for label in labels)


def labels_in(text: str) -> list[str]:
    """The source labels that occur in ``text`` (case-insensitive substrings)."""
    return [label for label in SOURCE_LABELS if label.lower() in text.lower()]


def assert_request_carries_no_labels(request: EditRequest) -> None:
    """``request`` has only the allowed fields, of the allowed types, and no field value is or
    contains a demographic label of the sources."""
    declared = tuple(field.name for field in dataclasses.fields(request))
    assert declared == ALLOWED_REQUEST_FIELDS, f"EditRequest fields {declared}"
    assert set(vars(request)) == set(ALLOWED_REQUEST_FIELDS), sorted(vars(request))
    assert isinstance(request.request_id, str) and isinstance(request.instruction, str)
    assert isinstance(request.seed, int)
    assert isinstance(request.extra_images, tuple)
    for image in request.source_images:
        assert isinstance(image, np.ndarray)
        assert image.dtype == np.uint8 and image.ndim == 3
    for name in ("request_id", "instruction"):
        found = labels_in(getattr(request, name))
        assert not found, f"request {request.request_id}: {name} contains {found}"


def same_outcome(first: EditOutcome, second: EditOutcome) -> bool:
    if (first.status, first.refusal_kind, first.message) != \
            (second.status, second.refusal_kind, second.message):
        return False
    if first.image is None or second.image is None:
        return first.image is None and second.image is None
    return bool(np.array_equal(first.image, second.image))


class EditorContract:
    """Checks every Editor must pass; see the module docstring for the fixtures to provide."""

    #: Whether an ``ok`` image keeps the source's height and width.
    keeps_resolution: ClassVar[bool] = True
    #: Whether equal requests give equal outcomes (false for sampling APIs without a seed).
    deterministic: ClassVar[bool] = True
    #: Statuses the fixture's requests must produce, so that each check below has cases.
    expected_statuses: ClassVar[frozenset[str]] = frozenset({"ok", "refused"})

    def test_requests_carry_only_what_an_editor_needs(
            self, edit_requests: Sequence[EditRequest]) -> None:
        for request in edit_requests:
            assert_request_carries_no_labels(request)

    def test_one_outcome_per_request(self, editor: Editor,
                                     edit_requests: Sequence[EditRequest]) -> None:
        outcomes = editor.edit(edit_requests)
        assert isinstance(outcomes, list) and len(outcomes) == len(edit_requests)
        assert all(isinstance(outcome, EditOutcome) for outcome in outcomes)
        assert editor.edit([]) == []

    def test_outcomes_follow_the_order_of_the_requests(
            self, editor: Editor, edit_requests: Sequence[EditRequest]) -> None:
        if not self.deterministic:
            return
        forward = editor.edit(edit_requests)
        backward = editor.edit(list(edit_requests)[::-1])
        alone = [editor.edit([request])[0] for request in edit_requests]
        for index, outcome in enumerate(forward):
            assert same_outcome(outcome, backward[-1 - index]), index
            assert same_outcome(outcome, alone[index]), index

    def test_outcomes_are_valid(self, editor: Editor,
                                edit_requests: Sequence[EditRequest]) -> None:
        seen = set()
        for request, outcome in zip(edit_requests, editor.edit(edit_requests), strict=True):
            seen.add(outcome.status)
            assert outcome.status in ("ok", "refused", "error")
            assert isinstance(outcome.message, str)
            if outcome.status == "ok":
                image = outcome.image
                assert isinstance(image, np.ndarray) and image.dtype == np.uint8
                assert image.ndim == 3 and image.shape[2] == 3 and min(image.shape[:2]) > 0
                if self.keeps_resolution:
                    assert image.shape == request.source_image.shape
            elif outcome.status == "refused":
                assert isinstance(outcome.refusal_kind, str) and outcome.refusal_kind
                assert outcome.image is None
            else:
                assert outcome.message and outcome.image is None
        assert self.expected_statuses <= seen, f"the requests gave only {sorted(seen)}"

    def test_source_images_are_left_alone(self, editor: Editor,
                                          edit_requests: Sequence[EditRequest]) -> None:
        before = [[image.copy() for image in request.source_images] for request in edit_requests]
        outcomes = editor.edit(edit_requests)
        for request, originals, outcome in zip(edit_requests, before, outcomes, strict=True):
            for image, original in zip(request.source_images, originals, strict=True):
                assert np.array_equal(image, original)
                if outcome.image is not None:
                    assert not np.shares_memory(outcome.image, image)


class RecordingEditor(Editor):
    """A stand-in for a real (non-simulated) adapter that records what it is given.

    It mirrors the image, and refuses about one request in four (chosen by request id, so the
    choice is stable). It also has an ``attach_design`` method, as bait: the generate stage must
    hand plan rows to simulated editors only, whatever methods another editor has.
    """

    received: ClassVar[list[EditRequest]] = []
    designs: ClassVar[list[Mapping[str, Any]]] = []

    @classmethod
    def forget(cls) -> None:
        cls.received.clear()
        cls.designs.clear()

    def attach_design(self, design: Mapping[str, Any]) -> None:
        RecordingEditor.designs.append(design)

    def edit(self, requests: Sequence[EditRequest]) -> list[EditOutcome]:
        outcomes = []
        for request in requests:
            RecordingEditor.received.append(request)
            if int(request.request_id[:8], 16) % 4 == 0:
                outcomes.append(EditOutcome(status="refused", refusal_kind="policy",
                                            message="declined by the recording editor"))
            else:
                mirrored = np.ascontiguousarray(request.source_image[:, ::-1])
                outcomes.append(EditOutcome(status="ok", image=mirrored))
        return outcomes


def recording_editor() -> RecordingEditor:
    return RecordingEditor("test:recording", EditorConfig(), "recording-1")


def assert_generation_request_carries_no_labels(request: GenerationRequest) -> None:
    """``request`` has only the prompt, its id and its seed; the id carries no label (the
    prompt itself may name an attribute: that is what a T2I audit asks for)."""
    declared = tuple(field.name for field in dataclasses.fields(request))
    assert declared == ALLOWED_GENERATION_FIELDS, f"GenerationRequest fields {declared}"
    assert isinstance(request.prompt, str) and isinstance(request.seed, int)
    assert not labels_in(request.request_id), request.request_id


class GeneratorContract:
    """Checks every text-to-image Generator must pass. A test class provides the fixtures
    ``generator`` (ready to generate; a simulated one with its design attached) and
    ``generation_requests`` (enough requests that every status in ``expected_statuses``
    occurs)."""

    deterministic: ClassVar[bool] = True
    expected_statuses: ClassVar[frozenset[str]] = frozenset({"ok", "refused"})

    def test_requests_carry_only_what_a_generator_needs(
            self, generation_requests: Sequence[GenerationRequest]) -> None:
        for request in generation_requests:
            assert_generation_request_carries_no_labels(request)

    def test_one_outcome_per_request_in_order(
            self, generator: Generator, generation_requests: Sequence[GenerationRequest]) -> None:
        outcomes = generator.generate(generation_requests)
        assert isinstance(outcomes, list) and len(outcomes) == len(generation_requests)
        assert all(isinstance(outcome, Outcome) for outcome in outcomes)
        assert generator.generate([]) == []
        if self.deterministic:
            backward = generator.generate(list(generation_requests)[::-1])
            for index, outcome in enumerate(outcomes):
                assert same_outcome(outcome, backward[-1 - index]), index

    def test_outcomes_are_valid(self, generator: Generator,
                                generation_requests: Sequence[GenerationRequest]) -> None:
        seen = set()
        for outcome in generator.generate(generation_requests):
            seen.add(outcome.status)
            if outcome.status == "ok":
                image = outcome.image
                assert isinstance(image, np.ndarray) and image.dtype == np.uint8
                assert image.ndim == 3 and image.shape[2] == 3 and min(image.shape[:2]) > 0
            elif outcome.status == "refused":
                assert outcome.refusal_kind and outcome.image is None
            else:
                assert outcome.status == "error" and outcome.message and outcome.image is None
        assert self.expected_statuses <= seen, f"the requests gave only {sorted(seen)}"


class RecordingGenerator(Generator):
    """A stand-in for a real text-to-image adapter that records what it is given: it paints a
    small image from the prompt's hash and refuses about one prompt in five (chosen by request
    id). Like :class:`RecordingEditor` it has an ``attach_design`` bait method."""

    received: ClassVar[list[GenerationRequest]] = []
    designs: ClassVar[list[Mapping[str, Any]]] = []

    @classmethod
    def forget(cls) -> None:
        cls.received.clear()
        cls.designs.clear()

    def attach_design(self, design: Mapping[str, Any]) -> None:
        RecordingGenerator.designs.append(design)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Outcome]:
        outcomes = []
        for request in requests:
            RecordingGenerator.received.append(request)
            if int(request.request_id[:8], 16) % 5 == 0:
                outcomes.append(Outcome(status="refused", refusal_kind="policy",
                                        refusal_code="test_policy",
                                        message="declined by the recording generator"))
                continue
            rng = np.random.default_rng([request.seed, len(request.prompt)])
            image = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
            outcomes.append(Outcome(status="ok", image=image, cost_usd=0.01,
                                    peak_gpu_memory_mb=None))
        return outcomes


class PairEditor(RecordingEditor):
    """A recording editor that takes up to two portraits per request (the WinoBias pairs)."""

    max_source_images: ClassVar[int] = 2


def recording_generator() -> RecordingGenerator:
    return RecordingGenerator("test:recording-t2i", EditorConfig(), "recording-1")

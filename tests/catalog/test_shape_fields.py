"""One list of a model's shape fields (planning/types.py SHAPE_FIELDS), and everything that
carries a shape holds to it: the catalog's model, the planner's Shape, the model-files reader, the
API and the cluster's settings file."""

from __future__ import annotations

from dataclasses import fields

from catalog.api.serializers import ServedModelSerializer
from catalog.modelfiles import ModelFilesShape
from catalog.models import ServedModel
from catalog.services.cluster_settings import MODEL_KEYS
from planning import Shape
from planning.types import SHAPE_FIELDS


def test_the_model_keeps_every_shape_field():
    concrete = {f.name for f in ServedModel._meta.concrete_fields}
    assert [f for f in SHAPE_FIELDS if f not in concrete] == []


def test_the_planner_and_the_model_files_reader_carry_the_shape_and_nothing_else_unlisted():
    assert [f.name for f in fields(Shape)] == [*SHAPE_FIELDS, "context_length"]
    assert [f.name for f in fields(ModelFilesShape)] == [*SHAPE_FIELDS, "context_length", "notes"]


def test_the_api_and_the_settings_file_take_the_shape_by_the_same_names():
    assert set(SHAPE_FIELDS) <= set(ServedModelSerializer.Meta.fields)
    assert set(SHAPE_FIELDS) <= MODEL_KEYS

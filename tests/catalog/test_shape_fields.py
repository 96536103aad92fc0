"""One list of a model's shape fields (planning/types.py SHAPE_FIELDS), and everything that
carries a shape holds to it: the catalog's model, the planner's Shape, the model-files reader, the
API, the admin, the importer and the cluster's settings file."""

from __future__ import annotations

from dataclasses import fields

from django.db.models import CharField

from catalog.admin import ServedModelAdminForm
from catalog.api.serializers import ServedModelSerializer
from catalog.modelfiles import ModelFilesShape
from catalog.models import ServedModel
from catalog.services.catalog import set_shape
from catalog.services.cluster_settings import MODEL_KEYS
from planning import Shape
from planning.types import SHAPE_FIELDS, TEXT_SHAPE_FIELDS


def test_the_model_keeps_every_shape_field():
    concrete = {f.name for f in ServedModel._meta.concrete_fields}
    assert [f for f in SHAPE_FIELDS if f not in concrete] == []


def test_the_planner_and_the_model_files_reader_carry_the_shape_and_nothing_else_unlisted():
    assert [f.name for f in fields(Shape)] == [*SHAPE_FIELDS, "context_length"]
    assert [f.name for f in fields(ModelFilesShape)] == [*SHAPE_FIELDS, "context_length", "notes"]


def test_the_api_and_the_settings_file_take_the_shape_by_the_same_names():
    assert set(SHAPE_FIELDS) <= set(ServedModelSerializer.Meta.fields)
    assert set(SHAPE_FIELDS) <= MODEL_KEYS


# Written out where they must be literal (the model's field declarations, the dataclasses above;
# the migrations follow the model, which makemigrations --check holds), derived everywhere else.
NOT_SHAPE = {"id", "name", "source", "context_length", "declared", "declared_in"}


def test_the_model_declares_the_shape_fields_in_their_order_and_no_other():
    declared = [f.name for f in ServedModel._meta.concrete_fields if f.name not in NOT_SHAPE]
    assert declared == list(SHAPE_FIELDS)


def test_the_text_shape_fields_are_the_models_text_fields_of_the_shape():
    texts = [f.name for f in ServedModel._meta.concrete_fields if isinstance(f, CharField)]
    assert [f for f in texts if f in SHAPE_FIELDS] == list(TEXT_SHAPE_FIELDS)


def test_the_admin_edits_every_shape_field():
    form_fields = ServedModelAdminForm.base_fields
    assert [f for f in SHAPE_FIELDS if f not in form_fields] == []


def test_the_importer_writes_every_shape_field_and_an_unknown_text_as_empty():
    shape = ModelFilesShape(layers=2, dtype=None, expert_format="mxfp4", context_length=4096)
    model = ServedModel(name="m")
    set_shape(model, shape.as_fields())
    assert {f: getattr(model, f) for f in (*SHAPE_FIELDS, "context_length")} == {
        **shape.as_fields(),
        "dtype": "",
        "attention": "",
    }

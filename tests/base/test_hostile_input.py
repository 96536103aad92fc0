"""Hostile files refused with a sentence, nothing saved: a config.json nested too deeply, with a
5000-digit number or too large, through import_model and the admin upload alike."""

from __future__ import annotations

import io

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from audit.models import AuditEntry
from catalog.modelfiles import MAX_JSON_BYTES
from catalog.models import ServedModel
from tests.support import builders as b

pytestmark = pytest.mark.django_db

HOSTILE = {
    "nested": (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests its values too deeply"),
    "huge int": (b'{"hidden_size": ' + b"9" * 5000 + b"}", "a number of 5000 digits"),
    "oversize": (b'{"pad": "' + b"x" * (MAX_JSON_BYTES + 1) + b'"}', "MiB such a file may be"),
}


@pytest.mark.parametrize("kind", HOSTILE)
def test_import_model_refuses_a_hostile_config_with_a_sentence(tmp_path, kind):
    data, sentence = HOSTILE[kind]
    (tmp_path / "config.json").write_bytes(data)
    with pytest.raises(CommandError, match=sentence):
        call_command("import_model", "evil", str(tmp_path), "--as", "pytest", stdout=io.StringIO())
    assert not ServedModel.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.parametrize("kind", HOSTILE)
def test_the_admin_upload_refuses_a_hostile_config_with_a_sentence(kind):
    data, sentence = HOSTILE[kind]
    client = Client()
    client.force_login(b.user("ed", roles=("editor",)))
    response = client.post(
        "/admin/catalog/servedmodel/import-config/",
        {"name": "evil", "source": "org/evil", "config": SimpleUploadedFile("config.json", data)},
    )
    assert response.status_code == 200
    assert sentence in response.content.decode()
    assert not ServedModel.objects.exists() and not AuditEntry.objects.exists()

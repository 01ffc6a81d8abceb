"""`mappings[].publish` and `audit_branch`: defaults, and errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from kafscale_lakehouse.config import ConfigError, parse_config


def document(tmp_path, **mapping: Any) -> dict[str, Any]:
    return {"segments": {"local_root": str(tmp_path / "segments")},
            "offsets": {"backend": "local", "local_path": str(tmp_path / "offsets.db")},
            "iceberg": {"catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}"},
                        "warehouse": str(tmp_path / "warehouse")},
            "mappings": [{"topic": "orders", "table": "prod.orders",
                          "schema": {"columns": [{"name": "order_id", "type": "string"}]}, **mapping}]}


def test_publish_defaults_to_direct_and_audited_takes_the_default_branch(tmp_path):
    [direct] = parse_config(document(tmp_path), source="t").mappings
    assert (direct.publish, direct.audit_branch) == ("direct", "kafscale-audit")
    [audited] = parse_config(document(tmp_path, publish="Audited", audit_branch="wap"), source="t").mappings
    assert (audited.publish, audited.audit_branch) == ("audited", "wap")


@pytest.mark.parametrize(("mapping", "expected"), [
    ({"publish": "sometimes"}, "mappings[0].publish: 'sometimes' is not one of direct, audited"),
    ({"publish": "audited", "audit_branch": "main"}, "mappings[0].audit_branch: must not be main"),
    ({"publish": "audited", "audit_branch": " "}, "mappings[0].audit_branch: must not be empty"),
    ({"publish": "audited", "mode": "upsert", "id_columns": ["order_id"]},
     "mappings[0].publish: audited is not supported with mode upsert"),
])
def test_each_publish_problem_names_its_key(tmp_path, mapping, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        parse_config(document(tmp_path, **mapping), source="t")

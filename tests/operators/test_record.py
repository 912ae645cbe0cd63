"""The operator record: one immutable object per operator, built by the registry and carried
by every definition it loads, so that the layers below the boundary never look a name up."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from fuseval import operators
from fuseval.operators import OperatorRecord, implementations, load, mutants
from fuseval.properties.hooks import hooks_of

OP = "residual_rmsnorm"          # the smallest operator
VARIANT_OP = "qwen2vl_decoder_layer"


def test_every_definition_of_an_operator_carries_its_one_record():
    record = operators.record(VARIANT_OP)
    assert isinstance(record, OperatorRecord) and record.name == VARIANT_OP
    variant = record.variants[1]
    for defn in (load(VARIANT_OP), load(VARIANT_OP, "small"), load(VARIANT_OP, "small", variant),
                 load(VARIANT_OP).with_config({"hidden_size": 96}).with_variant(variant),
                 implementations.get(VARIANT_OP, "tiny").definition):
        assert defn.operator is record, defn.config
    assert implementations.get(VARIANT_OP).record is record
    # the record's definition is the operator's data, and points back at it
    assert record.definition == load(VARIANT_OP) and record.definition.operator is record
    assert record.variants == tuple(load(VARIANT_OP).variant_names)


def test_the_record_is_immutable_and_resolves_what_the_spec_names():
    record = operators.record(OP)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.definition = None
    spec = operators.spec(OP)
    assert record.spec is spec and record.package == spec.package and record.directory is None
    assert record.budget_path == spec.budget_path() and record.budget_path.endswith("budget.json")
    assert record.cost_model is spec.resolve(spec.cost_model)
    assert record.cost_model is record.cost_model                  # resolved once
    assert hooks_of(record) is hooks_of(load(OP, "small"))
    assert [m.name for m in mutants.catalogue(load(OP))] == [m.name for m in mutants.catalogue(OP)]


def test_a_spec_registered_anew_gets_a_record_of_its_own(monkeypatch):
    old = operators.record(OP)
    registry = dict(operators.registry())
    registry[OP] = dataclasses.replace(registry[OP], budget=None)
    monkeypatch.setattr(operators, "_REGISTRY", registry)
    new = load(OP).operator
    assert new is not old and new.budget_path is None and old.budget_path is not None
    assert load(OP, "small").operator is new


def test_a_definition_travels_to_another_process_as_data():
    defn = load(OP, "small")
    back = pickle.loads(pickle.dumps(defn))
    assert back == defn and back.operator is None and defn.operator is operators.record(OP)
    # and reads as data: its record does not lead back to it
    assert dataclasses.asdict(defn)["operator"]["spec"]["name"] == OP


def test_the_records_load_is_what_load_gives_under_the_variant_scope():
    record = operators.record(VARIANT_OP)
    assert record.load() is record.definition
    with operators.variant_scope({VARIANT_OP: record.variants[1]}):
        assert record.load() == load(VARIANT_OP) and record.load().variant == record.variants[1]

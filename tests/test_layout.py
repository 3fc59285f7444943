"""The bucket contract (backend/runtime/layout.py): names readers take, and folders published whole."""

import os

import pytest

from backend.runtime import layout
from backend.runtime.layout import ADAPTER_NAME_RE, FRAGMENT_RE, FragmentWriter, publish_folder

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["trainer-000000.jsonl", "trainer-rank1-000042.jsonl",
                                  "panel-alerts.1a2b-000003.jsonl", "proxy-123456.jsonl"])
def test_fragment_names_of_writers_are_read(name):
    assert FRAGMENT_RE.match(name)


@pytest.mark.parametrize("name", [".trainer-000001.jsonl", "_tmp-000001.jsonl", "_tmpk3j2-000001.jsonl",
                                  "_tmp_trainer-000001.jsonl", "trainer-000001.jsonl.tmp", "trainer-1.jsonl"])
def test_names_on_their_way_to_a_final_name_are_not_fragments(name):
    assert not FRAGMENT_RE.match(name)


@pytest.mark.parametrize("name,version", [("trl-policy-v1", 1), ("trl-policy-v120", 120)])
def test_adapter_folders_are_named_by_version(name, version):
    assert layout.adapter_name(version) == name, "a lone run keeps TRL's own names"
    assert layout.adapter_version(name) == layout.adapter_version(name, "") == version
    assert layout.adapter_member(name) == ""


@pytest.mark.parametrize("member,version,name", [("m0", 3, "trl-policy-m0-v3"), ("lr1e4", 12, "trl-policy-lr1e4-v12"),
                                                 ("v2", 5, "trl-policy-v2-v5")])
def test_a_sweep_members_versions_carry_its_tag_and_no_other_member_reads_them_as_its_own(member, version, name):
    assert layout.adapter_name(version, member) == name
    assert layout.adapter_base(member) + f"-v{version}" == name, "TRL names `<its _lora_name>-v<N>`"
    assert layout.adapter_version(name, member) == version
    assert layout.adapter_member(name) == member
    assert layout.adapter_version(name, "") is None, "a lone run does not take a member's version as its own"
    assert layout.adapter_version(name, "other") is None
    assert layout.adapter_version(layout.adapter_name(version), member) is None


@pytest.mark.parametrize("member", ["M0", "a-b", "a_b", "", "x" * 13, "../x"])
def test_a_tag_that_cannot_be_part_of_a_name_is_refused(member):
    if member:
        with pytest.raises(ValueError, match="1-12 lowercase letters or digits"):
            layout.adapter_name(1, member)
    assert not layout.MEMBER_RE.match(member)


@pytest.mark.parametrize("name", ["_tmp-trl-policy-v3", ".trl-policy-v3", "_tmpx", "trl-policy-v3.tmp"])
def test_hidden_and_temporary_folders_are_not_adapter_versions(name):
    assert not ADAPTER_NAME_RE.match(name)


def test_a_fragment_writer_numbers_after_its_own_fragments_and_ignores_temporary_ones(tmp_path):
    (tmp_path / "trainer-000004.jsonl").write_text("{}\n")
    (tmp_path / "_tmp-000009.jsonl").write_text("{}\n")
    (tmp_path / "proxy-000007.jsonl").write_text("{}\n")
    assert FragmentWriter(str(tmp_path), "trainer").seq == 5


def test_publish_folder_shows_nothing_until_the_whole_folder_is_renamed_into_place(tmp_path):
    dest = tmp_path / "adapters" / "trl-policy-v1"
    with publish_folder(str(dest)) as tmp:
        assert os.path.basename(tmp).startswith("_tmp") and os.path.dirname(tmp) == str(dest.parent)
        (open(os.path.join(tmp, "a.json"), "w")).close()
        assert not dest.exists()
    assert sorted(os.listdir(dest)) == ["a.json"]
    assert os.listdir(dest.parent) == ["trl-policy-v1"]


def test_publish_folder_replaces_a_folder_already_there_and_keeps_it_when_the_writer_fails(tmp_path):
    dest = tmp_path / "final"
    dest.mkdir()
    (dest / "old").write_text("old")
    with pytest.raises(RuntimeError), publish_folder(str(dest)) as tmp:
        (open(os.path.join(tmp, "new"), "w")).close()
        raise RuntimeError("save failed")
    assert os.listdir(dest) == ["old"] and os.listdir(tmp_path) == ["final"]
    with publish_folder(str(dest)) as tmp:
        (open(os.path.join(tmp, "new"), "w")).close()
    assert os.listdir(dest) == ["new"] and os.listdir(tmp_path) == ["final"]


def test_publish_folder_without_replace_leaves_another_writers_folder_alone(tmp_path):
    dest = tmp_path / "base-model"
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    with pytest.raises(OSError), publish_folder(str(dest), replace=False) as tmp:
        (open(os.path.join(tmp, "config.json"), "w")).close()
    assert os.listdir(dest) == ["config.json"] and (dest / "config.json").read_text() == "{}"
    assert os.listdir(tmp_path) == ["base-model"]

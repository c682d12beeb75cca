"""Settings from the environment: a typo of a FANOUT_ setting stops start-up with its name;
the project's tooling variables (engine scripts, test knobs) are not settings and pass."""

from __future__ import annotations

import pytest

from fanout.config import ConfigError, load_settings


def test_a_misspelt_setting_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="FANOUT_MAX_GROUP_MEMBER\\b"):
        load_settings({"FANOUT_MAX_GROUP_MEMBER": "10"})


@pytest.mark.parametrize(
    "name",
    [
        "FANOUT_ENGINES",
        "FANOUT_ENGINES_DIR",
        "FANOUT_ENGINES_CACHE",
        "FANOUT_INVARIANT_EXAMPLES",
        "FANOUT_TESTS_WITHOUT_ENGINES",
    ],
)
def test_the_engine_scripts_and_test_knobs_are_not_settings(name: str) -> None:
    settings = load_settings({name: "x", "FANOUT_MAX_GROUP_MEMBERS": "10"})
    assert settings.params.max_group_members == 10

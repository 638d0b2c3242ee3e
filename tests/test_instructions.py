"""Instructions as data: every suite's file, read by the one loader (sim/instructions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import embodied
import sim
from embodied.core.errors import EmbodiedError
from embodied.core.registry import get_task
from sim.instructions import InstructionFileError, load_instructions, template_fields

SIM = Path(sim.__file__).parent
# registered suite -> its instruction file
SUITES = {"manipulation": SIM / "manipulation" / "instructions.yaml",
          "navigation": SIM / "navigation" / "instructions.yaml",
          "metaworld-mt50": SIM / "metaworld" / "instructions.yaml"}


@pytest.mark.parametrize("suite", SUITES)
def test_file_is_what_the_registry_serves(suite):
    table = load_instructions(SUITES[suite])
    assert list(table) == embodied.list_tasks(suite), "one entry per task, in the suite's order"
    for task, words in table.items():
        spec = get_task(task)
        assert (spec.train_instructions, spec.heldout_instructions) == (words.train, words.heldout)


@pytest.mark.parametrize("suite", SUITES)
def test_splits_are_disjoint(suite):
    for task, words in load_instructions(SUITES[suite]).items():
        assert len(words.train) >= 5 and len(words.heldout) >= 3, task
        assert len(set(words.train)) == len(words.train) and len(set(words.heldout)) == len(words.heldout), task
        assert not set(words.train) & set(words.heldout), task


@pytest.mark.parametrize("suite", SUITES)
def test_every_template_field_exists_for_its_task(suite):
    """Each ``{field}`` of either split is a parameter the task's env samples, and fills in."""
    for task, words in load_instructions(SUITES[suite]).items():
        env = embodied.make_env(task)
        for seed in (0, 1):
            _, info = env.reset(seed=seed)
            for template in words.train + words.heldout:
                missing = template_fields(template) - set(info["params"])
                assert not missing, f"{task}: {template!r} uses {missing}; the task has {sorted(info['params'])}"
                assert "{" not in env.unwrapped.format_instruction(template)
        env.close()


GOOD = """\
pick:
  train:
    - "pick up the {color} block"
    - "lift the {color} block"
  heldout:
    - "hoist the {color} block"
"""


@pytest.mark.parametrize("text, line, says", [
    (GOOD.replace('"lift the {color} block"', '"lift the {color} block'), 6, "not valid YAML"),
    (GOOD.replace('    - "hoist', '\t- "hoist'), 6, "not valid YAML"),
    (GOOD.replace('"lift the {color} block"', '"lift the {color}\x07 block"'), 4, "control characters"),
    (GOOD.replace('"lift the {color} block"', "3"), 4, "must be a string"),
    (GOOD.replace('"lift the {color} block"', '"lift the {color block"'), 4, "not a template"),
    (GOOD.replace('"lift the {color} block"', '"lift the {0} block"'), 4, "plain name"),
    (GOOD.replace('"lift the {color} block"', '"lift the {color} block #1"'), 4, "characters"),
    (GOOD.replace('"lift the {color} block"', '"pick up the {color} block"'), 4, "twice"),
    (GOOD.replace('"hoist the {color} block"', '"lift the {color} block"'), 6, "also a training wording"),
    (GOOD.replace("  heldout:", "  test:"), 5, "not allowed"),
    (GOOD.replace('  heldout:\n    - "hoist the {color} block"\n', ""), 2, "lacks heldout"),
    (GOOD.replace('  heldout:\n    - "hoist the {color} block"\n', "  heldout: []\n"), 5, "non-empty list"),
    (GOOD + GOOD.split("\n", 1)[0] + "\n", 7, "appears twice"),
    ("- pick\n", 1, "map task names"),
])
def test_malformed_file_names_file_and_line(tmp_path, text, line, says):
    path = tmp_path / "instructions.yaml"
    path.write_text(text)
    with pytest.raises(InstructionFileError) as e:
        load_instructions(path)
    assert isinstance(e.value, EmbodiedError) and isinstance(e.value, ValueError)
    assert str(e.value).startswith(f"{path}:{line}:"), str(e.value)
    assert says in str(e.value)


def test_good_file_and_task_set(tmp_path):
    path = tmp_path / "instructions.yaml"
    path.write_text(GOOD)
    table = load_instructions(path, tasks=["pick"])
    assert table["pick"].train == ("pick up the {color} block", "lift the {color} block")
    assert table["pick"].heldout == ("hoist the {color} block",)
    with pytest.raises(InstructionFileError, match=f"{path}: no instructions for task 'push'"):
        table["push"]
    with pytest.raises(InstructionFileError, match=f"{path}:1:1: task 'pick' is not a task of this suite"):
        load_instructions(path, tasks=["push"])
    with pytest.raises(InstructionFileError, match=f"{path}: no instructions for task.* push"):
        load_instructions(path, tasks=["pick", "push"])
    with pytest.raises(InstructionFileError, match="cannot read"):
        load_instructions(tmp_path / "absent.yaml")
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    with pytest.raises(InstructionFileError, match="empty"):
        load_instructions(tmp_path / "empty.yaml")

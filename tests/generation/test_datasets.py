"""datasets.py: the datasets file, and the errors that name it."""
import pytest

from eagledata.errors import InputError
from eagledata.generation.conversations.datasets import load_datasets, select_datasets

PROMPT = '{"id": "1", "messages": [{"role": "user", "content": "q"}]}\n'


@pytest.fixture
def datasets_file(tmp_path):
    (tmp_path / "here.jsonl").write_text(PROMPT)
    path = tmp_path / "datasets.yaml"
    path.write_text("# two datasets\nhere:\n  prompts: here.jsonl\nmissing:\n  target_output_tokens: 100\n"
                    "  prompts: nowhere.jsonl\n")
    return path


def test_a_missing_prompts_file_names_the_datasets_file_and_line(datasets_file, tmp_path):
    """Issue 44 bug 7: the error named the prompts path and `missing.prompts`, not the datasets file to fix."""
    with pytest.raises(InputError) as e:
        select_datasets(datasets_file, ["here", "missing"])
    assert str(e.value) == (f"{datasets_file}:6 field 'missing.prompts': prompts file not found: "
                            f"{tmp_path / 'nowhere.jsonl'} (a relative path is read from the current folder, else "
                            f"beside the datasets file)")
    assert (e.value.path, e.value.line) == (str(datasets_file), 6)
    assert [s.name for s in select_datasets(datasets_file, "here")] == ["here"]  # only the chosen ones must exist
    specs = load_datasets(datasets_file)  # the file itself is fine
    assert (specs["missing"].source, specs["missing"].line) == (datasets_file, 6)
    with pytest.raises(InputError, match=r"datasets\.yaml:6 field 'missing\.prompts': prompts file not found"):
        load_datasets(datasets_file, check_prompts=True)  # budget.ipynb measures every dataset
    with pytest.raises(InputError, match=r"datasets\.yaml:6 field 'missing\.prompts': prompts file not found"):
        select_datasets(datasets_file, "all")


@pytest.mark.parametrize("name", ["[here, missing]", "here, missing", "['here', 'missing']"])
def test_a_list_given_as_one_name_says_how_to_pass_a_list(datasets_file, name):
    """Issue 44 bug 7: `papermill -p dataset "[a, b]"` passes one string; the error did not say to use -y."""
    with pytest.raises(InputError) as e:
        select_datasets(datasets_file, name)
    assert str(e.value) == (
        f"{datasets_file} field 'dataset': unknown dataset {name!r}; the file has here, missing. It looks like a "
        f"list given as one name: papermill's -p passes a string, so give a list as YAML (papermill -y \"dataset: "
        f"[here, missing]\"), or as several names on the command line (--dataset here missing)")


def test_an_unknown_plain_name_keeps_the_short_message(datasets_file):
    with pytest.raises(InputError) as e:
        select_datasets(datasets_file, "B9")
    assert str(e.value) == f"{datasets_file} field 'dataset': unknown dataset 'B9'; the file has here, missing"

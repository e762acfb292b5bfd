"""A rerun `compare` replaces its own TensorBoard output, and never touches a user's event files."""

from torch.utils.tensorboard import SummaryWriter

from lightning_perf.output.comparison_chart import _written_by_compare
from tests.cli.test_compare_command import compare, runs  # noqa: F401 (the fixture)


def test_rerunning_compare_leaves_one_comparison(runs):  # noqa: F811
    out_dir = runs[0].parent / "perf_compare"
    for _ in range(3):
        assert compare(*runs) == 0
    (event_file,) = out_dir.glob("events.out.tfevents.*")
    assert _written_by_compare(str(event_file))


def test_compare_never_removes_a_users_event_file(runs, tmp_path):  # noqa: F811
    user_run = tmp_path / "mine"
    with SummaryWriter(str(user_run)) as writer:
        writer.add_scalar("loss", 1.0, 0)
    (user_file,) = user_run.glob("events.out.tfevents.*")
    assert not _written_by_compare(str(user_file))
    for _ in range(2):
        assert compare(*runs, "--tensorboard-dir", user_run) == 0
    files = sorted(user_run.glob("events.out.tfevents.*"))
    assert user_file in files and len(files) == 2  # the user's, and one comparison

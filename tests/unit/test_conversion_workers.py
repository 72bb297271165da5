"""How many workers convert a sharded checkpoint to DeepSpeed's universal form: sized to the host, never fewer
than one, never more extract workers than there are shards to extract."""
from kevin_exp.trainer.checkpoint import conversion_workers


def test_extract_workers_follow_the_saved_ranks_and_the_cores():
    assert conversion_workers(4, cores=16)[0] == 4
    assert conversion_workers(8, cores=2)[0] == 2
    assert conversion_workers(1, cores=16)[0] == 1


def test_merge_workers_take_half_the_cores_up_to_eight():
    assert conversion_workers(4, cores=16)[1] == 8
    assert conversion_workers(4, cores=6)[1] == 3
    assert conversion_workers(4, cores=1) == (1, 1)

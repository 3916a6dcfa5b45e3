# The shard reader and the resumable, rank-count-independent data loader (no MPI: ranks are
# simulated in one process).
ct_add_test(loader TIMEOUT 120)

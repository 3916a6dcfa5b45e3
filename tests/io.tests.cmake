# io/tb_events: varints, CRC32C vectors, Event bytes, a file read back record by record.
ct_add_test(tb_events)
# TensorBoard event files of training runs, decoded by protoc --decode_raw (tests/tensorboard.sh).
ct_add_script_test(tensorboard tests/tensorboard.sh)
# Memory snapshots of training steps and of an allocation failure (tests/memory_snapshot.sh).
ct_add_script_test(memory_snapshot tests/memory_snapshot.sh)

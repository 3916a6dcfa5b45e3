/* io/tb_events: TensorBoard event files (events.out.tfevents.*), written without TensorFlow.
 *
 * An event file is a sequence of TFRecords, each
 *     uint64 length (LE) | uint32 masked crc32c(length bytes) | data | uint32 masked crc32c(data)
 * where mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, and each record's data is one
 * serialized tensorflow.Event protobuf:
 *     Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *               Summary summary = 5; }
 *     Summary { repeated Value value = 1; }
 *     Value   { string tag = 1; float simple_value = 2; }
 * The first record is an Event with file_version "brain.Event:2"; every scalar after it is an
 * Event with one Summary.Value (as torch.utils.tensorboard's add_scalar writes it).
 *
 * The writer owns its FILE; tb_add_scalar flushes each record to the kernel, so a crash keeps
 * every scalar written before it. CRC32C is ISA-L's crc32_iscsi (Debian's libisal). The
 * encoder pieces are exposed for tests/test_tb_events.c.
 */
#ifndef CT_IO_TB_EVENTS_H
#define CT_IO_TB_EVENTS_H

#include <stddef.h>
#include <stdint.h>

struct tb_writer;

/* Creates DIR/events.out.tfevents.<unix time, 10 digits>.<host>.<pid>.<n> (DIR must exist)
 * and writes the file_version record. Returns CT_OK, or CT_ERR_RUNTIME naming the file. */
int tb_open(struct tb_writer **w, const char *dir);
/* One scalar at a step; wall_time in seconds since the epoch. CT_ERR_RUNTIME on a write
 * failure (named once; later calls fail quietly). */
int tb_add_scalar(struct tb_writer *w, const char *tag, float value, int64_t step,
                  double wall_time);
const char *tb_path(const struct tb_writer *w);
void tb_close(struct tb_writer *w);

/* Seconds since the epoch, now (an Event's wall_time). */
double tb_wall_time(void);

/* ---- encoder pieces */

/* CRC32C (Castagnoli) of n bytes, and TFRecord's masking of a CRC. */
uint32_t tb_crc32c(const void *p, size_t n);
uint32_t tb_crc_mask(uint32_t crc);
/* Base-128 varint of v into out (at most 10 bytes); returns the bytes written. */
size_t tb_put_varint(uint8_t *out, uint64_t v);
/* A serialized Event: with tag != NULL a scalar, else the file_version record. Returns its
 * length; writes nothing past cap (a return > cap means the buffer was too small). */
size_t tb_encode_event(uint8_t *out, size_t cap, double wall_time, int64_t step, const char *tag,
                       float value);
/* A TFRecord around n bytes of data into out (n + 16 bytes). */
void tb_frame_record(uint8_t *out, const uint8_t *data, size_t n);

#endif

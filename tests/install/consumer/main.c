/* The C API of an installed kvoffload (also built through pkg-config by the install test). */
#include <stdio.h>

#include "kvoffload/kvoffload.h"

int main(void) {
  kvoffload_group_config_t group = KVOFFLOAD_GROUP_CONFIG_INIT;
  kvoffload_scheduler_config_t config = KVOFFLOAD_SCHEDULER_CONFIG_INIT;
  kvoffload_scheduler_t s = NULL;
  int version = 0;
  config.groups = &group;
  config.num_groups = 1;
  config.host_blocks = 16;
  if (kvoffload_get_version(&version) != KVOFFLOAD_SUCCESS) return 1;
  if (kvoffload_scheduler_create(&config, &s) != KVOFFLOAD_SUCCESS) return 2;
  if (kvoffload_scheduler_lookup(s, "nobody", 0, NULL) != KVOFFLOAD_INVALID_ARGUMENT) return 3;
  printf("consumer_c: kvoffload %d, error path: %s\n", version, kvoffload_last_error());
  if (kvoffload_last_error()[0] == '\0') return 4;
  kvoffload_scheduler_destroy(s);
  return 0;
}

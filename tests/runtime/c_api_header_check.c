/* Compiles include/kareus/c_api.h as C99: the header must stay usable from C programs. */
#include "kareus/c_api.h"

int kareus_c_header_check(void);
int kareus_c_header_check(void) {
  kareus_partition_info info = {0};
  kareus_controller_options options = {0};
  kareus_monitor_options monitor = {0};
  kareus_iteration_record record = {0};
  return info.sms + options.gpu_index + monitor.rank + record.instructions + KAREUS_OK +
         KAREUS_FORWARD;
}

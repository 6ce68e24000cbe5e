/* options.h: internal helpers around tp_options. */
#ifndef TPI_OPTIONS_H
#define TPI_OPTIONS_H

#include "tensorplay/rpc.h"

/* TP_OK for a valid timeout in seconds: >= 0 and finite within the limit, or
 * -1 (the default) when allow_default. Records a message otherwise. */
tp_status tpi_check_timeout(double seconds, int allow_default);

#endif

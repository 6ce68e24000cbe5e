/* options.h: internal helpers around tp_options. */
#ifndef TPI_OPTIONS_H
#define TPI_OPTIONS_H

#include "tensorplay/rpc.h"

/* TP_OK for a valid timeout in seconds: >= 0 and finite within the limit, or
 * -1 (the default) when allow_default. Records a message otherwise. */
tp_status tpi_check_timeout(double seconds, int allow_default);

/* Backend-specific keys, for validation at init. */
size_t tpi_options_nkeys(const tp_options *opts);
const char *tpi_options_key_at(const tp_options *opts, size_t i);

#endif

// xxHash (Debian libxxhash-dev), header-only: XXH_INLINE_ALL compiles it into each user, so
// kvdrive needs no library to link. Include this, not <xxhash.h>, in kvdrive headers.
#pragma once

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

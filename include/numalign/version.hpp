// numalign/version.hpp: the library's version.
#pragma once

#define NUMALIGN_VERSION "0.1.0"

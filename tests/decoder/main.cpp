// Catch2 main for the decoder tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

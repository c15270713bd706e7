#pragma once
#include "mock.h"

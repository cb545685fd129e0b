/* The OpenSHMEM 1.5 type tables as X-macros: X(TYPE, TYPENAME). shmem.h
 * declares every typed routine from them, src/shmem/c_*.cpp defines them
 * from the same lists, so the two cannot drift apart. */
#ifndef COREMESH_SHMEM_C_TYPE_TABLES_H
#define COREMESH_SHMEM_C_TYPE_TABLES_H

/* Standard RMA types (OpenSHMEM 1.5, Table 5). */
#define CM_SHMEM_RMA_TYPES(X)                                                          \
  X(float, float) X(double, double) X(long double, longdouble) X(char, char)           \
  X(signed char, schar) X(short, short) X(int, int) X(long, long)                      \
  X(long long, longlong) X(unsigned char, uchar) X(unsigned short, ushort)             \
  X(unsigned int, uint) X(unsigned long, ulong) X(unsigned long long, ulonglong)       \
  X(int8_t, int8) X(int16_t, int16) X(int32_t, int32) X(int64_t, int64)                \
  X(uint8_t, uint8) X(uint16_t, uint16) X(uint32_t, uint32) X(uint64_t, uint64)        \
  X(size_t, size) X(ptrdiff_t, ptrdiff)

/* Sized RMA routines: X(SIZE in bits). */
#define CM_SHMEM_SIZES(X) X(8) X(16) X(32) X(64) X(128)

/* Standard AMO types (Table 6). */
#define CM_SHMEM_AMO_STD_TYPES(X)                                                      \
  X(int, int) X(long, long) X(long long, longlong) X(unsigned int, uint)               \
  X(unsigned long, ulong) X(unsigned long long, ulonglong) X(int32_t, int32)           \
  X(int64_t, int64) X(uint32_t, uint32) X(uint64_t, uint64) X(size_t, size)            \
  X(ptrdiff_t, ptrdiff)
/* Extended AMO types (fetch, set, swap): the standard ones plus these. */
#define CM_SHMEM_AMO_EXT_ONLY_TYPES(X) X(float, float) X(double, double)
/* Bitwise AMO types (Table 7). */
#define CM_SHMEM_AMO_BITWISE_TYPES(X)                                                  \
  X(unsigned int, uint) X(unsigned long, ulong) X(unsigned long long, ulonglong)       \
  X(int32_t, int32) X(int64_t, int64) X(uint32_t, uint32) X(uint64_t, uint64)

/* Point-to-point synchronization types (Table 13). */
#define CM_SHMEM_P2P_TYPES(X)                                                          \
  X(short, short) X(int, int) X(long, long) X(long long, longlong)                     \
  X(unsigned short, ushort) X(unsigned int, uint) X(unsigned long, ulong)              \
  X(unsigned long long, ulonglong) X(int32_t, int32) X(int64_t, int64)                 \
  X(uint32_t, uint32) X(uint64_t, uint64) X(size_t, size) X(ptrdiff_t, ptrdiff)

/* Team reduction types (Table 11). */
#define CM_SHMEM_REDUCE_BITWISE_TYPES(X)                                               \
  X(unsigned char, uchar) X(unsigned short, ushort) X(unsigned int, uint)              \
  X(unsigned long, ulong) X(unsigned long long, ulonglong) X(int8_t, int8)             \
  X(int16_t, int16) X(int32_t, int32) X(int64_t, int64) X(uint8_t, uint8)              \
  X(uint16_t, uint16) X(uint32_t, uint32) X(uint64_t, uint64) X(size_t, size)
#define CM_SHMEM_REDUCE_MINMAX_TYPES(X)                                                \
  X(char, char) X(signed char, schar) X(short, short) X(int, int) X(long, long)        \
  X(long long, longlong) X(ptrdiff_t, ptrdiff) X(unsigned char, uchar)                 \
  X(unsigned short, ushort) X(unsigned int, uint) X(unsigned long, ulong)              \
  X(unsigned long long, ulonglong) X(int8_t, int8) X(int16_t, int16) X(int32_t, int32) \
  X(int64_t, int64) X(uint8_t, uint8) X(uint16_t, uint16) X(uint32_t, uint32)          \
  X(uint64_t, uint64) X(size_t, size) X(float, float) X(double, double)                \
  X(long double, longdouble)
#define CM_SHMEM_REDUCE_COMPLEX_TYPES(X) \
  X(cm_shmem_complexd, complexd) X(cm_shmem_complexf, complexf)

/* Deprecated (pre-1.4) atomics and waits. */
#define CM_SHMEM_OLD_AMO_TYPES(X) X(int, int) X(long, long) X(long long, longlong)
#define CM_SHMEM_OLD_WAIT_TYPES(X) \
  X(short, short) X(int, int) X(long, long) X(long long, longlong)

/* Deprecated active-set reductions (shmem_TYPENAME_OP_to_all). */
#define CM_SHMEM_TOALL_BITWISE_TYPES(X) \
  X(short, short) X(int, int) X(long, long) X(long long, longlong)
#define CM_SHMEM_TOALL_MINMAX_TYPES(X) \
  CM_SHMEM_TOALL_BITWISE_TYPES(X) X(float, float) X(double, double) X(long double, longdouble)

/* C11 generic selection lists: base types only (the fixed-width and
 * size_t/ptrdiff_t names alias them and may not appear twice). X(TYPE,
 * TYPENAME, A) passes A through (the routine name). */
#define CM_SHMEM_GENERIC_RMA_TYPES(X, A)                                               \
  X(float, float, A) X(double, double, A) X(long double, longdouble, A) X(char, char, A) \
  X(signed char, schar, A) X(short, short, A) X(int, int, A) X(long, long, A)          \
  X(long long, longlong, A) X(unsigned char, uchar, A) X(unsigned short, ushort, A)    \
  X(unsigned int, uint, A) X(unsigned long, ulong, A) X(unsigned long long, ulonglong, A)
#define CM_SHMEM_GENERIC_AMO_STD_TYPES(X, A)                                           \
  X(int, int, A) X(long, long, A) X(long long, longlong, A) X(unsigned int, uint, A)   \
  X(unsigned long, ulong, A) X(unsigned long long, ulonglong, A)
#define CM_SHMEM_GENERIC_AMO_EXT_TYPES(X, A) \
  CM_SHMEM_GENERIC_AMO_STD_TYPES(X, A) X(float, float, A) X(double, double, A)
/* Table 7 also lists int32_t and int64_t: signed types that no base type
 * of this list aliases (uint32_t/uint64_t alias the unsigned ones). */
#define CM_SHMEM_GENERIC_AMO_BITWISE_TYPES(X, A)                                       \
  X(unsigned int, uint, A) X(unsigned long, ulong, A) X(unsigned long long, ulonglong, A) \
  X(int32_t, int32, A) X(int64_t, int64, A)
#define CM_SHMEM_GENERIC_P2P_TYPES(X, A)                                               \
  X(short, short, A) X(int, int, A) X(long, long, A) X(long long, longlong, A)         \
  X(unsigned short, ushort, A) X(unsigned int, uint, A) X(unsigned long, ulong, A)     \
  X(unsigned long long, ulonglong, A)
/* Table 10's bitwise types: the unsigned base types and the signed
 * fixed-width ones (int8_t ... int64_t alias no type already listed). */
#define CM_SHMEM_GENERIC_REDUCE_BITWISE_TYPES(X, A)                                    \
  X(unsigned char, uchar, A) X(unsigned short, ushort, A) X(unsigned int, uint, A)     \
  X(unsigned long, ulong, A) X(unsigned long long, ulonglong, A) X(int8_t, int8, A)    \
  X(int16_t, int16, A) X(int32_t, int32, A) X(int64_t, int64, A)
#define CM_SHMEM_GENERIC_REDUCE_MINMAX_TYPES(X, A)                                     \
  X(char, char, A) X(signed char, schar, A) X(short, short, A) X(int, int, A)          \
  X(long, long, A) X(long long, longlong, A) X(unsigned char, uchar, A)                \
  X(unsigned short, ushort, A) X(unsigned int, uint, A) X(unsigned long, ulong, A)     \
  X(unsigned long long, ulonglong, A) X(float, float, A) X(double, double, A)          \
  X(long double, longdouble, A)
/* sum and prod: the min/max types and the complex ones. */
#define CM_SHMEM_GENERIC_REDUCE_ARITH_TYPES(X, A)                                      \
  CM_SHMEM_GENERIC_REDUCE_MINMAX_TYPES(X, A)                                           \
  X(cm_shmem_complexd, complexd, A) X(cm_shmem_complexf, complexf, A)

#endif

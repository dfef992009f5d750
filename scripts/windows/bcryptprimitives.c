/* A stand-in for Windows' bcryptprimitives.dll, for Wine 8.0 (Debian 12), which lacks it.
 *
 * Rust's standard library (1.78 and later) imports ProcessPrng from bcryptprimitives.dll for
 * HashMap seeds and the like; Windows 10 and later ship it, Wine from 9.x implements it, and
 * without it Wine 8.0 stops every Rust program at start-up. ProcessPrng fills a buffer with
 * random bytes and returns TRUE; this one asks RtlGenRandom (advapi32's SystemFunction036, which
 * Wine implements) for them. Nothing the project writes depends on these bytes: its outputs are
 * deterministic. Built and installed into the Wine prefix by scripts/check-windows; never shipped.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}

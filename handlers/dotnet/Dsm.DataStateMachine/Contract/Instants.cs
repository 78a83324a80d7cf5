// Instants as the protocol and the stores write them: UTC, to the microsecond, fixed width.
//
// A DateTime holds 100 ns ticks, so microseconds survive every sum a handler makes; what
// must never happen is a format that drops them ("o" trims trailing zeros, the default
// ToString drops the fraction, Mono.Data.Sqlite's own DateTime binding writes variable
// width text), since the kit judges retention one microsecond either side of its end.

using System;
using System.Globalization;

namespace Dsm.DataStateMachine
{
    public static class Instants
    {
        /// <summary>9999-12-31T23:59:59.999999Z: the last instant a record can hold (Python's datetime.max).</summary>
        public static readonly DateTime LastInstant =
            new DateTime(9999, 12, 31, 23, 59, 59, DateTimeKind.Utc).AddTicks(9999990);

        private const long TicksPerMicrosecond = 10;

        /// <summary>
        /// <paramref name="now"/> + <paramref name="duration"/>, or an
        /// <see cref="InstantOutOfRangeException"/> naming the option when the sum is past
        /// <see cref="LastInstant"/>. Nothing is written by a call that gets it.
        /// </summary>
        public static DateTime After(DateTime now, TimeSpan duration, string option)
        {
            if (duration.Ticks > LastInstant.Ticks - now.Ticks)
            {
                throw new InstantOutOfRangeException(option, Format(now), duration.ToString("c", CultureInfo.InvariantCulture));
            }
            return new DateTime(now.Ticks + duration.Ticks, DateTimeKind.Utc);
        }

        /// <summary>A whole number of microseconds as a <see cref="TimeSpan"/> (the protocol's durations).</summary>
        public static TimeSpan FromMicroseconds(long micros)
        {
            return TimeSpan.FromTicks(checked(micros * TicksPerMicrosecond));
        }

        /// <summary><c>2026-03-02T09:30:01.000000Z</c>: always six fractional digits and a four-digit year.</summary>
        public static string Format(DateTime instant)
        {
            var chars = new char[27];
            Write(instant, chars, 0);
            return new string(chars);
        }

        /// <summary>Writes the 27 characters of <see cref="Format"/> into <paramref name="into"/> at <paramref name="at"/>.</summary>
        public static void Write(DateTime instant, char[] into, int at)
        {
            long ticks = instant.Ticks;
            var day = new DateTime(ticks - ticks % TimeSpan.TicksPerDay);
            long inDay = ticks % TimeSpan.TicksPerDay;
            long micros = inDay / TicksPerMicrosecond;
            Digits(into, at, day.Year, 4);
            into[at + 4] = '-';
            Digits(into, at + 5, day.Month, 2);
            into[at + 7] = '-';
            Digits(into, at + 8, day.Day, 2);
            into[at + 10] = 'T';
            Digits(into, at + 11, (int)(micros / 3600000000L), 2);
            into[at + 13] = ':';
            Digits(into, at + 14, (int)(micros / 60000000L % 60), 2);
            into[at + 16] = ':';
            Digits(into, at + 17, (int)(micros / 1000000L % 60), 2);
            into[at + 19] = '.';
            Digits(into, at + 20, (int)(micros % 1000000L), 6);
            into[at + 26] = 'Z';
        }

        private static void Digits(char[] into, int at, int value, int width)
        {
            for (int i = width - 1; i >= 0; i--)
            {
                into[at + i] = (char)('0' + value % 10);
                value /= 10;
            }
        }

        /// <summary>
        /// Reads <c>YYYY-MM-DDTHH:MM:SS[.f{1,6}]Z</c> (the protocol's instants); false for
        /// anything else, including a date that does not exist.
        /// </summary>
        public static bool TryParse(string text, out DateTime instant)
        {
            instant = default(DateTime);
            if (text == null || text.Length < 20 || text[text.Length - 1] != 'Z') return false;
            if (text[4] != '-' || text[7] != '-' || text[10] != 'T' || text[13] != ':' || text[16] != ':') return false;
            int year, month, day, hour, minute, second;
            if (!Number(text, 0, 4, out year) || !Number(text, 5, 2, out month) || !Number(text, 8, 2, out day)
                || !Number(text, 11, 2, out hour) || !Number(text, 14, 2, out minute) || !Number(text, 17, 2, out second))
            {
                return false;
            }
            long fractionTicks = 0;
            int end = text.Length - 1;
            if (end > 19)
            {
                int digits = end - 20;
                if (text[19] != '.' || digits < 1 || digits > 6) return false;
                int fraction;
                if (!Number(text, 20, digits, out fraction)) return false;
                for (int i = digits; i < 7; i++) fraction *= 10;
                fractionTicks = fraction;
            }
            else if (end != 19)
            {
                return false;
            }
            if (year < 1 || month < 1 || month > 12 || day < 1 || day > DateTime.DaysInMonth(year, month)
                || hour > 23 || minute > 59 || second > 59)
            {
                return false;
            }
            instant = new DateTime(year, month, day, hour, minute, second, DateTimeKind.Utc).AddTicks(fractionTicks);
            return true;
        }

        private static bool Number(string text, int at, int length, out int value)
        {
            value = 0;
            for (int i = at; i < at + length; i++)
            {
                char c = text[i];
                if (c < '0' || c > '9') return false;
                value = value * 10 + (c - '0');
            }
            return true;
        }
    }
}
